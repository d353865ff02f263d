#!/usr/bin/env bash
# ab_compare.sh: two shardlm variants (binaries, deck overrides, environment) on one benchmark shape, their
# runs interleaved, each variant's median and B/A in one table: the A/B a schedule or kernel change wants,
# since the same binary's step moves 1-2% from run to run and more between GPU pairs. Runs
# bench/llama_compare.sh (the shardlm side only) once per round, GPU count and variant; bench/ab_table.py
# gathers the records.
#
#   bash bench/ab_compare.sh [options] RT OUT
#
# RT: the runtime bundle (RT/env.sh, sourced around each mpirun only), or "-" for the mpirun on PATH.
# OUT gets ab.jsonl (one record a run: variant, round, GPU count), ab.md (the table), ab.log (all output,
# each run's command included) and runs.tar.gz (every run's log and metrics, without the generated data).
#
# Options:
#   --a-bin PATH, --b-bin PATH  the variants' binaries (default build/bin/shardlm; B's defaults to A's)
#   --a-args "A", --b-args "B"  each variant's deck overrides (word-split), e.g. "--fsdp.forward_prefetch=false"
#   --a-env "K=V ...", --b-env  each variant's environment (word-split; NCCL_* ones reach the ranks by mpirun -x,
#                               the others by inheritance)
#   --a-name N, --b-name N      the variants' names in the table (default: a, b)
#   --shape S                   one of bench/scaling.sh's shapes (llama8b by default; bench_lib.sh's BENCH_SHAPES), or
#   --row ROW                   any llama_compare.sh row, label=DECK:LAYERS:SEQ:MICRO[:ac]
#   --gpus LIST                 GPU counts, e.g. 1,2 (default 1); FULL_SHARD over them
#   --repeat N                  rounds (default 3): each runs both variants at every GPU count, A first in odd
#                               rounds and B first in even ones, so that drift falls on both
#   --steps N, --warmup N       steps a run and those left out of its median (default 12, 4)
#   --trace-step K              record step K's timeline in every run (default 0: none)
#   --timeout S                 limit a run (default 120)
#   --budget S                  start no run after S seconds (default 540, for a 10-minute command; 0 = none)
#   --dry-run                   print every command, run none (writes the records and table all the same)
set -uo pipefail

usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

A_BIN=build/bin/shardlm B_BIN="" A_ARGS="" B_ARGS="" A_ENV="" B_ENV="" A_NAME=a B_NAME=b SHAPE=llama8b ROW=""
GPU_LIST=1 REPEAT=3 STEPS=12 WARMUP=4 TRACE_STEP=0 RUN_TIMEOUT=120 BUDGET=540 DRY=0
POS=()
while [ $# -gt 0 ]; do
  case $1 in
    --a-bin) A_BIN=$2; shift ;;
    --b-bin) B_BIN=$2; shift ;;
    --a-args) A_ARGS=$2; shift ;;
    --b-args) B_ARGS=$2; shift ;;
    --a-env) A_ENV=$2; shift ;;
    --b-env) B_ENV=$2; shift ;;
    --a-name) A_NAME=$2; shift ;;
    --b-name) B_NAME=$2; shift ;;
    --shape) SHAPE=$2; shift ;;
    --row) ROW=$2; shift ;;
    --gpus) GPU_LIST=$2; shift ;;
    --repeat) REPEAT=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --trace-step) TRACE_STEP=$2; shift ;;
    --timeout) RUN_TIMEOUT=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --dry-run) DRY=1 ;;
    -h|--help) usage 0 ;;
    -) POS+=("$1") ;;
    -*) echo "ab_compare.sh: unknown option $1" >&2; usage ;;
    *) POS+=("$1") ;;
  esac
  shift
done
[ ${#POS[@]} -eq 2 ] || usage
RT=${POS[0]} OUT=${POS[1]}
B_BIN=${B_BIN:-$A_BIN}
for v in REPEAT STEPS WARMUP TRACE_STEP RUN_TIMEOUT BUDGET; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "ab_compare.sh: ${v,,} wants a whole number, not '${!v}'" >&2; exit 2; }
done
[ "$REPEAT" -ge 1 ] || { echo "ab_compare.sh: --repeat wants 1 or more" >&2; exit 2; }
IFS=, read -r -a COUNTS <<< "$GPU_LIST"
for g in "${COUNTS[@]}"; do
  [[ $g =~ ^[1-9][0-9]*$ ]] || { echo "ab_compare.sh: --gpus wants counts like 1,2, not '$GPU_LIST'" >&2; exit 2; }
done

# Paths given relative to where the script was started from, before it moves to the repository root.
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
[ "$RT" != - ] && [ -d "$RT" ] && RT=$(cd "$RT" && pwd)
for v in A_BIN B_BIN; do [ -e "${!v}" ] && printf -v "$v" '%s' "$(cd "$(dirname "${!v}")" && pwd)/$(basename "${!v}")"; done
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/bench_lib.sh
source bench/bench_lib.sh
if [ -z "$ROW" ]; then
  ROW=$(bench_shape_row "$SHAPE") || { echo "ab_compare.sh: unknown shape '$SHAPE' (${BENCH_SHAPES// /, }; or --row)" >&2; exit 2; }
fi
if [ "$DRY" = 0 ]; then
  for b in "$A_BIN" "$B_BIN"; do [ -x "$b" ] || { echo "ab_compare.sh: $b not found or not executable" >&2; exit 1; }; done
  [ "$RT" = - ] || [ -f "$RT/env.sh" ] || { echo "ab_compare.sh: $RT/env.sh not found ('-' uses the mpirun on PATH)" >&2; exit 1; }
fi
exec > >(tee "$OUT/ab.log") 2>&1
TEE_PID=$!
START=$(date +%s)
say() { echo "[ab $(( $(date +%s) - START ))s] $*"; }
say "A = $A_NAME: $A_BIN ${A_ARGS:+args \"$A_ARGS\" }${A_ENV:+env \"$A_ENV\"}"
say "B = $B_NAME: $B_BIN ${B_ARGS:+args \"$B_ARGS\" }${B_ENV:+env \"$B_ENV\"}"
say "row $ROW; GPUs ${COUNTS[*]}; $REPEAT round(s); $STEPS steps, $WARMUP warm-up"

COMMON=(--sides shardlm --steps "$STEPS" --warmup "$WARMUP" --timeout "$RUN_TIMEOUT" --trace-step "$TRACE_STEP")
[ "$RT" != - ] && COMMON+=(--rt "$RT")
[ "$BUDGET" -gt 0 ] && COMMON+=(--deadline $(( START + BUDGET )))
[ "$DRY" = 1 ] && COMMON+=(--dry-run)
JSONL=$OUT/ab.jsonl
: > "$JSONL"
mkdir -p "$OUT/runs"

run_variant() {  # v round gpus
  local v=$1 r=$2 g=$3 bin args envs name dir
  if [ "$v" = a ]; then bin=$A_BIN args=$A_ARGS envs=$A_ENV name=$A_NAME; else bin=$B_BIN args=$B_ARGS envs=$B_ENV name=$B_NAME; fi
  dir=$OUT/runs/$v-g$g-r$r
  say "round $r, $g GPU(s): $v ($name)"
  local cmd=(bash bench/llama_compare.sh "${COMMON[@]}" --bin "$bin" --gpus "$g")
  [ -n "$args" ] && cmd+=(--shardlm-args "$args")
  # shellcheck disable=SC2086
  env $envs "${cmd[@]}" "$ROW" "$dir"
  python3 bench/ab_table.py append --variant "$v" --name "$name" --round "$r" --gpus "$g" "$dir/llama.jsonl" "$JSONL"
}
for r in $(seq 1 "$REPEAT"); do
  for g in "${COUNTS[@]}"; do
    if [ $((r % 2)) = 1 ]; then run_variant a "$r" "$g"; run_variant b "$r" "$g"
    else run_variant b "$r" "$g"; run_variant a "$r" "$g"; fi
  done
done

GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
TITLE="A/B on ${GPU_NAME:-?}, ${ROW%%=*}: medians over steps $((WARMUP + 1))-$STEPS, then over $REPEAT round(s) ($(date -u +%Y-%m-%d))"
python3 bench/ab_table.py finish --title "$TITLE" "$JSONL" "$OUT/ab.md"
echo
cat "$OUT/ab.md"
echo
find "$OUT/runs" -name 'data_*.jsonl' -delete   # generated text, remade by any run
tar -C "$OUT" -czf "$OUT/runs.tar.gz" runs && rm -rf "$OUT/runs"
say "done: $OUT/ab.jsonl, $OUT/ab.md, $OUT/ab.log, $OUT/runs.tar.gz"
RC=0
[ "$DRY" = 1 ] || grep -q '"status": "ok"' "$JSONL" || { say "no run succeeded"; RC=1; }
exec 1>&- 2>&-
wait "$TEE_PID" 2>/dev/null
exit $RC
