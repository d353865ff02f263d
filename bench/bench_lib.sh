# shellcheck shell=bash
# bench_lib.sh: shell helpers shared by the bench/ drivers (sourced, not run).

# bench_reap PATTERN...: after a run that timed out or failed, end what it left on the GPUs: the
# compute processes nvidia-smi lists whose command line contains one of the patterns (only the
# drivers' own programs, by pid), so that the next run starts on empty GPUs. Says what it ends on
# stdout. Nothing without nvidia-smi.
bench_reap() {
  command -v nvidia-smi >/dev/null || return 0
  local pid cmd pat any=0
  for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
    cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) || continue
    for pat in "$@"; do
      [ -n "$pat" ] || continue
      if [[ $cmd == *"$pat"* ]]; then
        echo "ending leftover pid $pid: $cmd"
        kill -9 "$pid" 2>/dev/null
        any=1
        break
      fi
    done
  done
  [ $any = 1 ] && sleep 3
  return 0
}
