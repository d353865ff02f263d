#!/usr/bin/env bash
# scaling.sh: shardlm against PyTorch FSDP2 from 1 GPU to G, per-GPU tokens/s, scaling efficiency,
# memory and one step's timeline per side, in one table. Runs bench/llama_compare.sh once per shape
# and GPU count and gathers its records (bench/scaling_table.py makes the table).
#
#   bash bench/scaling.sh [options] RT OUT
#
# RT: the runtime bundle (RT/env.sh, sourced around each mpirun only), or "-" for the mpirun on PATH.
# OUT gets scaling.jsonl (one record per run), scaling.md (the tables), scaling.log (all output,
# each run's command included) and runs.tar.gz (every run's log, metrics and timelines).
#
# Shapes (random weights; bf16 parameters, fp32 reduction and master, AdamW, clipping 1.0):
#   llama1b  Llama-3.2-1B (input/bench/llama32-1b.ini: 128k vocabulary, GQA, tied head), 2048 x 4 a GPU
#   llama8b  Llama-3.1-8B with 8 of its 32 layers (input/bench/llama31-8b.ini), 2048 x 2 a GPU
#   bloom    BLOOM-560M (input/bench/bloom560m.ini), 512 x 8 a GPU
#   and, named only: llama3b (Llama-3.2-3B's shape, input/bench/llama32-3b.ini, 2048 x 4 a GPU) and
#   llama8b8k (the llama8b shape at 8192 x 1 a GPU), held-out shapes of the kind issue 30 is checked on
# Sides: shardlm (mpirun -np G), FSDP2 eager (torchrun --nproc-per-node G bench/fsdp2_bloom.py) and,
# with --compile, FSDP2 with torch.compile per block. Strategy FULL_SHARD on G > 1; on 1 GPU the
# same, a shard group of one.
#
# Efficiency = tok/s/GPU on G GPUs / tok/s/GPU on 1 GPU, same shape and side. Medians over the steps
# after --warmup. Step --trace-step of every run is recorded (shardlm --run.trace_step, PyTorch
# torch.profiler) and summarised by bench/trace_summary.py as compute / exposed communication /
# optimizer / idle, rank 0's (that step stays in the median; it is a little slower).
#
# Emulated nodes over a slow link (issue 30, item 6):
#   --emulated-nodes N  every G-GPU run is HYBRID_SHARD over N nodes of G/N consecutive ranks:
#                       shardlm --dist.ranks_per_node=G/N, FSDP2 HSDP on a (N, G/N) mesh (replicate
#                       x shard); GPU counts N does not divide are left out; 1 GPU stays the baseline
#   --slow-link         NCCL over its socket transport for every run of the command (baseline too):
#                       NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_NET=Socket, and
#                       NCCL_DEBUG=INFO so each record lists the transports the logs show
#                       ("nccl_transports": NET/Socket expected). The whole run: the intra-node
#                       (shard) groups go over sockets too, as NCCL reads these once per process.
#
# Options:
#   --gpus LIST        GPU counts, e.g. 1,2 (default 1,2,4,8 up to what nvidia-smi lists)
#   --shapes LIST      of llama1b,llama8b,bloom,llama3b,llama8b8k (default llama1b,llama8b,bloom)
#   --compile          add the FSDP2 + torch.compile side
#   --steps N          steps a run (default 20); --warmup N left out of the medians (default 8)
#   --repeat N         run every (shape, GPU count) N times (default 1), the counts alternating
#                      (1, 2, 1, 2, ...); the table gives each side's median of its runs, their range,
#                      and efficiency and ratios from the medians
#   --trace-step K     the step whose timeline is recorded (default warmup + 2; 0 = none)
#   --timeout S        limit a run (default 300)
#   --budget S         start no run after S seconds (default 540, for a 10-minute command; 0 = none)
#   --bin PATH         the shardlm binary (default build/bin/shardlm)
#   --keep-runs        leave OUT/runs/ unpacked beside runs.tar.gz
#   --keep-traces      keep PyTorch's profiler traces in runs.tar.gz (tens of MB each: left out by
#                      default, their summaries are in the records; shardlm's timelines always kept)
#   --dry-run          print every command, run none (writes the records and tables all the same)
#   --shardlm-args "A" extra deck overrides for every shardlm run (e.g. a CPU smoke test)
# Runs go shape by shape, 1 GPU first, shardlm then FSDP2 each (with --repeat, run by run), so a cut-off
# leaves whole baselines.
set -uo pipefail

usage() { sed -n '2,52p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

GPU_LIST="" SHAPES=llama1b,llama8b,bloom COMPILE=0 STEPS=20 WARMUP=8 TRACE_STEP="" RUN_TIMEOUT=300 REPEAT=1
BUDGET=540 BIN=build/bin/shardlm KEEP_RUNS=0 KEEP_TRACES=0 DRY=0 NODES=0 SLOW=0 SHARDLM_ARGS=""
POS=()
while [ $# -gt 0 ]; do
  case $1 in
    --gpus) GPU_LIST=$2; shift ;;
    --shapes) SHAPES=$2; shift ;;
    --compile) COMPILE=1 ;;
    --steps) STEPS=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --repeat) REPEAT=$2; shift ;;
    --trace-step) TRACE_STEP=$2; shift ;;
    --timeout) RUN_TIMEOUT=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --bin) BIN=$2; shift ;;
    --keep-runs) KEEP_RUNS=1 ;;
    --keep-traces) KEEP_TRACES=1 ;;
    --dry-run) DRY=1 ;;
    --emulated-nodes) NODES=$2; shift ;;
    --slow-link) SLOW=1 ;;
    --shardlm-args) SHARDLM_ARGS=$2; shift ;;
    -h|--help) usage 0 ;;
    -) POS+=("$1") ;;
    -*) echo "scaling.sh: unknown option $1" >&2; usage ;;
    *) POS+=("$1") ;;
  esac
  shift
done
[ ${#POS[@]} -eq 2 ] || usage
RT=${POS[0]} OUT=${POS[1]}
for v in STEPS WARMUP RUN_TIMEOUT BUDGET NODES REPEAT; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "scaling.sh: ${v,,} wants a whole number, not '${!v}'" >&2; exit 2; }
done
[ "$STEPS" -gt "$WARMUP" ] || { echo "scaling.sh: --steps must exceed --warmup" >&2; exit 2; }
[ "$REPEAT" -ge 1 ] || { echo "scaling.sh: --repeat wants 1 or more" >&2; exit 2; }
TRACE_STEP=${TRACE_STEP:-$(( WARMUP + 2 <= STEPS ? WARMUP + 2 : STEPS ))}
if ! [[ $TRACE_STEP =~ ^[0-9]+$ ]] || [ "$TRACE_STEP" -gt "$STEPS" ]; then
  echo "scaling.sh: --trace-step wants 0 (none) to --steps" >&2; exit 2
fi

# Paths given relative to where the script was started from, before it moves to the repository root.
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
[ "$RT" != - ] && [ -d "$RT" ] && RT=$(cd "$RT" && pwd)
[ -e "$BIN" ] && BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
cd "$(dirname "$0")/.." || exit 1
exec > >(tee "$OUT/scaling.log") 2>&1
TEE_PID=$!
START=$(date +%s)
say() { echo "[scaling $(( $(date +%s) - START ))s] $*"; }

# ---- GPUs ---------------------------------------------------------------------------------
HAVE=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
if [ -z "$GPU_LIST" ]; then
  GPU_LIST=""
  for g in 1 2 4 8; do [ "$g" -le "${HAVE:-0}" ] && GPU_LIST="$GPU_LIST${GPU_LIST:+,}$g"; done
  [ -n "$GPU_LIST" ] || { echo "scaling.sh: nvidia-smi lists no GPU; name the counts with --gpus" >&2; exit 1; }
fi
COUNTS=()
IFS=, read -r -a wanted <<< "$GPU_LIST"
for g in "${wanted[@]}"; do
  [[ $g =~ ^[1-9][0-9]*$ ]] || { echo "scaling.sh: --gpus wants counts like 1,2,4, not '$GPU_LIST'" >&2; exit 2; }
  if [ "$DRY" = 0 ] && [ "${HAVE:-0}" -gt 0 ] && [ "$g" -gt "$HAVE" ]; then say "$g GPUs: this machine has $HAVE, left out"; continue; fi
  if [ "$NODES" -gt 0 ] && [ "$g" -gt 1 ] && { [ "$g" -lt "$NODES" ] || [ $((g % NODES)) != 0 ]; }; then
    say "$g GPUs: not $NODES emulated nodes of whole GPUs, left out"; continue
  fi
  COUNTS+=("$g")
done
[ ${#COUNTS[@]} -gt 0 ] || { echo "scaling.sh: no GPU count left to run" >&2; exit 2; }

# ---- mode ---------------------------------------------------------------------------------
MODE=scaling
if [ "$NODES" -gt 0 ]; then MODE="hsdp-${NODES}nodes"; fi
if [ "$SLOW" = 1 ]; then
  export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_NET=Socket NCCL_DEBUG=INFO
  MODE="$MODE-sockets"
fi
SIDES=shardlm,eager
[ "$COMPILE" = 1 ] && SIDES=$SIDES,compile
COMMON=(--bin "$BIN" --steps "$STEPS" --warmup "$WARMUP" --timeout "$RUN_TIMEOUT" --sides "$SIDES" --trace-step "$TRACE_STEP")
[ "$RT" != - ] && COMMON+=(--rt "$RT")
[ "$BUDGET" -gt 0 ] && COMMON+=(--deadline $(( START + BUDGET )))
[ "$DRY" = 1 ] && COMMON+=(--dry-run)
[ -n "$SHARDLM_ARGS" ] && COMMON+=(--shardlm-args "$SHARDLM_ARGS")
if [ "$DRY" = 0 ] && [ "$RT" != - ] && [ ! -f "$RT/env.sh" ]; then
  echo "scaling.sh: $RT/env.sh not found (../shared/device/bundle-runtime makes it; '-' uses the mpirun on PATH)" >&2; exit 1
fi
if [ "$DRY" = 0 ]; then
  [ -f "$BIN" ] && [ ! -x "$BIN" ] && chmod +x "$BIN"
  [ -x "$BIN" ] || { echo "scaling.sh: $BIN not found: build it with CUDA first (bench/README.md)" >&2; exit 1; }
fi

# shellcheck source=bench/bench_lib.sh
source bench/bench_lib.sh
IFS=, read -r -a shape_list <<< "$SHAPES"
for s in "${shape_list[@]}"; do bench_shape_row "$s" >/dev/null || { echo "scaling.sh: unknown shape '$s' (${BENCH_SHAPES// /, })" >&2; exit 2; }; done

say "mode $MODE; GPUs ${COUNTS[*]} of ${HAVE:-0} x ${GPU_NAME:-unknown GPU}; shapes $SHAPES; sides $SIDES; $STEPS steps, $WARMUP warm-up, timeline of step $TRACE_STEP; $REPEAT run(s) each"
[ "$SLOW" = 1 ] && say "slow link: $(env | grep '^NCCL_' | sort | tr '\n' ' ')"

JSONL=$OUT/scaling.jsonl
: > "$JSONL"
mkdir -p "$OUT/runs"
for s in "${shape_list[@]}"; do
  row=$(bench_shape_row "$s")
  for r in $(seq 1 "$REPEAT"); do
    for g in "${COUNTS[@]}"; do
      dir=$OUT/runs/$s-g$g
      [ "$r" -gt 1 ] && dir=$dir-r$r
      strat=()
      [ "$NODES" -gt 0 ] && [ "$g" -gt 1 ] && strat=(--strategy HYBRID_SHARD --nodes "$NODES")
      say "$s on $g GPU(s)${strat[*]:+ (${strat[*]})}$([ "$REPEAT" -gt 1 ] && echo ", run $r of $REPEAT")"
      bash bench/llama_compare.sh "${COMMON[@]}" --gpus "$g" "${strat[@]}" "$row" "$dir"
      python3 bench/scaling_table.py append --shape "$s" --mode "$MODE" --gpus "$g" --repeat "$r" "$dir/llama.jsonl" "$JSONL"
    done
  done
done

TITLE="shardlm vs PyTorch FSDP2, $MODE, on ${GPU_NAME:-?} (${HAVE:-?} on the host): medians over steps $((WARMUP + 1))-$STEPS$([ "$REPEAT" -gt 1 ] && echo ", then over $REPEAT runs") ($(date -u +%Y-%m-%d))"
python3 bench/scaling_table.py finish --title "$TITLE" "$JSONL" "$OUT/scaling.md"
echo
cat "$OUT/scaling.md"
echo
[ $KEEP_TRACES = 1 ] || find "$OUT/runs" -path '*/profile_*' -name 'profile_step*_rank0.json' -delete
find "$OUT/runs" -name 'data_*.jsonl' -delete   # generated text, remade by any run
tar -C "$OUT" -czf "$OUT/runs.tar.gz" runs
[ $KEEP_RUNS = 1 ] || rm -rf "$OUT/runs"
say "done: $OUT/scaling.jsonl, $OUT/scaling.md, $OUT/scaling.log, $OUT/runs.tar.gz"
RC=0
[ "$DRY" = 1 ] || grep -q '"status": "ok"' "$JSONL" || { say "no run succeeded"; RC=1; }
exec 1>&- 2>&-
wait "$TEE_PID" 2>/dev/null
exit $RC
