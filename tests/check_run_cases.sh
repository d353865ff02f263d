#!/usr/bin/env bash
# tests/run_cases.sh against a fake Boost.Test binary: a suite of three cases (one passes, one fails, one outlasts its
# timeout) and a case outside the suite. The state file records each outcome; a second call runs nothing; a call
# with --retry-failed runs only the failed and timed-out cases again; a budget leaves cases for a later call;
# the launcher gets -np N; --only matches a case's name with or without its suite.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "check_run_cases: $*" >&2; exit 1; }

cat > "$W/fake_test" <<'FAKE'
#!/usr/bin/env bash
if [ "$1" = --list_content ]; then printf 'suite*\n    good_one*\n    bad_one*\n    slow_one*\nloose_case*\n' >&2; exit 0; fi
echo "$1" >> "${FAKE_CALLS:?}"
case "$1" in
  --run_test=suite/good_one|--run_test=loose_case) exit 0 ;;
  --run_test=suite/bad_one) [ "${FAKE_FIXED:-0}" = 1 ] && exit 0; exit 201 ;;
  --run_test=suite/slow_one) [ "${FAKE_FIXED:-0}" = 1 ] && exit 0; sleep 5 ;;
  *) exit 3 ;;
esac
FAKE
cat > "$W/launcher" <<'LAUNCH'
#!/usr/bin/env bash
[ "$1" = -np ] || exit 9
echo "np $2" >> "${FAKE_CALLS:?}"
shift 2
exec "$@"
LAUNCH
chmod +x "$W/fake_test" "$W/launcher"
export FAKE_CALLS="$W/calls"
RUN="bash $HERE/run_cases.sh"

# 1. Every case once, directly: one pass each in and out of the suite, a failure, a timeout; exit 1.
$RUN --np 0 --case-timeout 2 --state "$W/s1" "$W/fake_test" > "$W/out1" 2>&1 && fail "a failing case gave exit 0"
for want in "pass suite/good_one" "fail suite/bad_one" "timeout suite/slow_one" "pass loose_case"; do
  grep -q "^$want " "$W/s1" || fail "state lacks '$want': $(cat "$W/s1")"
done
[ "$(wc -l < "$W/s1")" -eq 4 ] || fail "four cases, four lines: $(cat "$W/s1")"
grep -q "2 passed, 1 failed, 1 timed out" "$W/out1" || fail "summary: $(cat "$W/out1")"
[ -e "$W/s1.logs/suite__bad_one.log" ] || fail "no log of suite/bad_one"

# 2. Again: nothing left to run (failures stay until --retry-failed); still exit 1.
: > "$FAKE_CALLS"
$RUN --np 0 --case-timeout 2 --state "$W/s1" "$W/fake_test" > "$W/out2" 2>&1 && fail "recorded failures gave exit 0"
[ ! -s "$FAKE_CALLS" ] || fail "a resumed call ran cases again: $(cat "$FAKE_CALLS")"
grep -q "ran 0 now" "$W/out2" || fail "summary: $(cat "$W/out2")"

# 3. --retry-failed, the two fixed: only they run, through the launcher with -np 2; exit 0.
FAKE_FIXED=1 $RUN --np 2 --mpirun "$W/launcher" --retry-failed --state "$W/s1" "$W/fake_test" > "$W/out3" 2>&1 ||
  fail "fixed cases still fail: $(cat "$W/out3")"
[ "$(grep -c '^--run_test' "$FAKE_CALLS")" -eq 2 ] || fail "retried other cases: $(cat "$FAKE_CALLS")"
grep -q "^np 2$" "$FAKE_CALLS" || fail "the launcher did not get -np 2: $(cat "$FAKE_CALLS")"
grep -q "4 passed, 0 failed, 0 timed out" "$W/out3" || fail "summary: $(cat "$W/out3")"

# 4. A budget of 1 s: the last case is left for the next call, whether the timed-out one (2 s) spent the budget
# or the clock's second turned before it (then it is left too).
$RUN --np 0 --case-timeout 2 --budget 1 --state "$W/s4" "$W/fake_test" > "$W/out4" 2>&1
grep -Eq " [1-4] left by the budget" "$W/out4" || fail "summary: $(cat "$W/out4")"
grep -q " loose_case " "$W/s4" && fail "ran a case past the budget: $(cat "$W/s4")"
$RUN --np 0 --case-timeout 2 --only loose --state "$W/s4" "$W/fake_test" > "$W/out5" 2>&1
grep -q "^pass loose_case " "$W/s4" || fail "the left case did not run next time: $(cat "$W/s4")"

# 5. --only anchored at a case's own name (without its suite): only that case runs.
$RUN --np 0 --case-timeout 2 --only '^good_one$' --state "$W/s5" "$W/fake_test" > "$W/out6" 2>&1
[ "$(cut -d' ' -f2 "$W/s5")" = suite/good_one ] || fail "--only '^good_one\$': $(cat "$W/s5")"

# 6. Bad usage: exit 2.
$RUN --np x "$W/fake_test" > /dev/null 2>&1; [ $? -eq 2 ] || fail "--np x: not exit 2"
$RUN "$W/missing" > /dev/null 2>&1; [ $? -eq 2 ] || fail "a missing binary: not exit 2"
echo "check_run_cases: ok"
