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

# bench_run_limit LEFT TIMEOUT: the seconds the next run may take, the smaller of what the budget
# leaves (LEFT) and the per-run limit; fails (prints nothing) when fewer than 30 are left.
bench_run_limit() {
  local left=$1 timeout=$2
  [ "$left" -ge 30 ] || return 1
  echo $(( left < timeout ? left : timeout ))
}

# bench_nvsmi_start FILE BACKEND: sample every GPU's memory.used (MiB) into FILE every 200 ms in the
# background until bench_nvsmi_stop; nothing unless BACKEND is cuda and nvidia-smi is here.
BENCH_NVSMI_PID=""
bench_nvsmi_start() {
  BENCH_NVSMI_PID=""
  [ "$2" = cuda ] && command -v nvidia-smi >/dev/null || return 0
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 200 > "$1" 2>/dev/null &
  BENCH_NVSMI_PID=$!
}
bench_nvsmi_stop() {
  [ -n "$BENCH_NVSMI_PID" ] && { kill "$BENCH_NVSMI_PID" 2>/dev/null; wait "$BENCH_NVSMI_PID" 2>/dev/null; }
  BENCH_NVSMI_PID=""
  return 0
}
# bench_nvsmi_peak FILE GPUS: the largest memory.used that FILE (bench_nvsmi_start's) holds for any of the
# first GPUS GPUs, in bytes; nothing when it holds none (no file, not on the GPU).
bench_nvsmi_peak() {
  [ -r "$1" ] || return 0
  awk -F', *' -v gpus="$2" '$1 ~ /^[0-9]+$/ && $1 < gpus && $2 ~ /^[0-9.]+$/ && (n == 0 || $2 > best) { best = $2; n = 1 }
    END { if (n) printf "%.0f\n", best * 1048576 }' "$1"
}

# The named benchmark shapes (bench/README.md, "scaling.sh"): bench/scaling.sh's default three, then two
# held-out ones of the kind issue 30 is checked on (Llama-3.2-3B's shape; 8192-token sequences).
BENCH_SHAPES="llama1b llama8b bloom llama3b llama8b8k"
# bench_shape_row SHAPE: bench/llama_compare.sh's row (label=DECK:LAYERS:SEQ:MICRO) of one of the named
# benchmark shapes; fails for another name.
bench_shape_row() {
  case $1 in
    llama1b) echo "llama1b=input/bench/llama32-1b.ini:16:2048:4" ;;
    llama8b) echo "llama8b=input/bench/llama31-8b.ini:8:2048:2" ;;
    bloom) echo "bloom=input/bench/bloom560m.ini:24:512:8" ;;
    llama3b) echo "llama3b=input/bench/llama32-3b.ini:28:2048:4" ;;
    llama8b8k) echo "llama8b8k=input/bench/llama31-8b.ini:8:8192:1" ;;
    *) return 1 ;;
  esac
}
