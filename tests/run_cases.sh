#!/usr/bin/env bash
# run_cases.sh: a Boost.Test suite's cases one at a time (under mpirun, or directly), within a time budget, and
# resumable: a state file records each case's outcome, and a later call runs only the cases it does not list. For
# the GPU suites on 4 or 8 ranks, which outlast one 10-minute device command (test_cuda_engine's 50 cases take
# well over 10 minutes on 4 ranks): carry the state file from one command to the next.
#
#   bash tests/run_cases.sh [options] BINARY
#
# Options:
#   --np N            ranks (mpirun -np N; default 1); 0 runs the binary directly
#   --mpirun CMD      the launcher (default: mpirun --bind-to none), word-split
#   --budget S        start no case after S seconds (default 540; 0 = none)
#   --case-timeout S  limit one case (default 300)
#   --state FILE      the outcomes, one line a case: "pass|fail|timeout CASE SECONDS" (default BINARY's name
#                     .cases in the working directory); each case's output goes to FILE.logs/CASE.log
#   --only REGEX      only the cases whose name, with or without its suite (suite/case), matches (grep -E)
#   --retry-failed    run the cases the state file lists as failed or timed out again (default: leave them)
#   -h, --help        this text
#
# Prints one line a case and a summary: passed, failed, timed out, left (not run: the budget). Exit status 0 when
# no case failed or timed out (left ones do not count), 1 otherwise, 2 for bad usage.
set -uo pipefail

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

NP=1 MPIRUN="mpirun --bind-to none" BUDGET=540 CASE_TIMEOUT=300 STATE="" ONLY="" RETRY=0 BIN=""
while [ $# -gt 0 ]; do
  case $1 in
    --np) NP=$2; shift ;;
    --mpirun) MPIRUN=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --case-timeout) CASE_TIMEOUT=$2; shift ;;
    --state) STATE=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --retry-failed) RETRY=1 ;;
    -h|--help) usage 0 ;;
    -*) echo "run_cases.sh: unknown option $1" >&2; usage ;;
    *) [ -z "$BIN" ] || { echo "run_cases.sh: one binary, not $BIN and $1" >&2; usage; }; BIN=$1 ;;
  esac
  shift
done
[ -n "$BIN" ] || usage
[ -x "$BIN" ] || { echo "run_cases.sh: $BIN is not an executable" >&2; exit 2; }
for v in "$NP" "$BUDGET" "$CASE_TIMEOUT"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "run_cases.sh: $v is not a whole number of ranks or seconds" >&2; exit 2; }
done
[ -n "$STATE" ] || STATE="$(basename "$BIN").cases"
LOGS="$STATE.logs"
mkdir -p "$LOGS" && touch "$STATE" || { echo "run_cases.sh: cannot write $STATE" >&2; exit 2; }

# Boost.Test's --list_content (on stderr): a suite's name, then its cases indented by four spaces; an enabled
# entry ends in "*". Cases outside any suite are not indented. The test path is suite/case, or the case alone: an
# unindented name is a suite when indented names follow it, else a case.
LIST=()
suite="" top=""
while IFS= read -r line; do
  name=${line%\*}
  if [[ $line =~ ^[[:space:]]{4}[^[:space:]] ]]; then
    [ -z "$top" ] || suite=$top
    top=""
    LIST+=("$suite/${name#    }")
  elif [[ $line =~ ^[^[:space:]] ]]; then
    [ -z "$top" ] || LIST+=("$top")
    top=$name
  fi
done < <("$BIN" --list_content 2>&1 >/dev/null)
[ -z "$top" ] || LIST+=("$top")
[ ${#LIST[@]} -gt 0 ] || { echo "run_cases.sh: $BIN --list_content listed no case" >&2; exit 2; }

recorded() {  # the outcome the state file holds for case $1, if any (the last line of it)
  awk -v c="$1" '$2 == c { o = $1 } END { if (o != "") print o }' "$STATE"
}

start=$(date +%s)
ran=0 left=0
for c in "${LIST[@]}"; do
  [ -z "$ONLY" ] || [[ $c =~ $ONLY ]] || [[ ${c##*/} =~ $ONLY ]] || continue
  prev=$(recorded "$c")
  if [ "$prev" = pass ] || { [ -n "$prev" ] && [ $RETRY = 0 ]; }; then continue; fi
  now=$(date +%s)
  if [ "$BUDGET" -gt 0 ] && [ $((now - start)) -ge "$BUDGET" ]; then left=$((left + 1)); continue; fi
  log="$LOGS/${c//\//__}.log"
  if [ "$NP" -eq 0 ]; then
    timeout "$CASE_TIMEOUT" "$BIN" --run_test="$c" > "$log" 2>&1
  else
    # shellcheck disable=SC2086  # the launcher's words
    timeout "$CASE_TIMEOUT" $MPIRUN -np "$NP" "$BIN" --run_test="$c" > "$log" 2>&1
  fi
  rc=$?
  took=$(($(date +%s) - now))
  outcome=pass
  [ $rc -eq 0 ] || outcome=fail
  [ $rc -eq 124 ] && outcome=timeout
  echo "$outcome $c $took" >> "$STATE"
  echo "[run_cases $(($(date +%s) - start))s] $outcome $c (${took}s)"
  ran=$((ran + 1))
done

count() { awk -v o="$1" '{ last[$2] = $1 } END { n = 0; for (c in last) if (last[c] == o) n++; print n }' "$STATE"; }
passed=$(count pass) failed=$(count fail) timedout=$(count timeout)
echo "run_cases.sh: $BIN on $NP rank(s): ran $ran now; in $STATE: $passed passed, $failed failed, $timedout timed out;" \
     "$left left by the budget"
awk '{ last[$2] = $1 } END { for (c in last) if (last[c] != "pass") print "  " last[c] ": " c }' "$STATE" | sort
[ "$failed" -eq 0 ] && [ "$timedout" -eq 0 ]
