#!/usr/bin/env bash
# gpu_compare.sh: shardlm's CUDA backend against PyTorch FSDP2, side by side, on one GPU machine.
#
#   bash bench/gpu_compare.sh [options] RT OUT
#
# RT is the folder made by `../shared/device/bundle-runtime RT build/bin/shardlm` on the build
# machine (its env.sh puts the bundled OpenMPI, HDF5 and Boost on the paths); "-" uses the mpirun
# already on PATH. OUT receives bench.jsonl (one record per run), bench.md (the table),
# bench.log (this script's output) and runs.tar.gz (every run's log and metrics). It builds
# nothing: build/bin/shardlm must have been built with CUDA, here or on the build machine.
#
# For each configuration it runs shardlm (mpirun -np G, deck input/bench/bloom560m.ini, overrides
# on the command line) and then bench/fsdp2_bloom.py (torchrun --nproc-per-node G) on the same
# model, sequence length, micro-batch and GPUs, each under a time limit, and prints:
#   config | GPUs | shardlm tok/s/GPU | PyTorch tok/s/GPU | ratio | shardlm GiB | PyTorch GiB | ratio
# bench/README.md says what the columns mean.
#
# Options:
#   --quick          tiny model (vocab 1024, hidden 256, 4 layers, seq 128, micro-batch 4),
#                    5 steps, 2 of them warm-up: checks the path end to end in a minute or two
#   --steps N        steps per run (default 30)
#   --warmup N       first steps left out of the medians (default 10)
#   --gpus N         use N GPUs (default: all that `nvidia-smi -L` lists)
#   --only LIST      comma-separated subset of: full,sgo,hybrid,noshard,single,full_ac,offload,
#                    offload_res (offload: CPU offload on one GPU, shardlm's fsdp.cpu_offload against
#                    FSDP2's CPUOffloadPolicy, beside the unsharded run `single`; offload_res: both
#                    with activation checkpointing, shardlm also keeping --resident-gib of the root's
#                    optimizer state on the GPU (fsdp.offload_resident_gib); not in the default set)
#   --resident-gib X fsdp.offload_resident_gib of the offload_res row (default 2.7)
#   --timeout S      limit per run in seconds (default 150; --quick 90)
#   --budget S       stop starting runs when this many seconds have passed (default 540)
#   --bin PATH       the shardlm binary (default build/bin/shardlm)
#   --skip-pytorch, --skip-shardlm    run one side only
#   --keep-runs      leave OUT/runs/ unpacked as well as runs.tar.gz
set -uo pipefail

usage() { sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

QUICK=0 STEPS="" WARMUP="" GPUS="" ONLY="" RUN_TIMEOUT="" BUDGET=540 BIN=build/bin/shardlm
SKIP_PT=0 SKIP_SL=0 KEEP_RUNS=0 BACKEND=cuda RESIDENT_GIB=2.7
POS=()
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1 ;;
    --steps) STEPS=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --gpus) GPUS=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --timeout) RUN_TIMEOUT=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --bin) BIN=$2; shift ;;
    --resident-gib) RESIDENT_GIB=$2; shift ;;
    --skip-pytorch) SKIP_PT=1 ;;
    --skip-shardlm) SKIP_SL=1 ;;
    --keep-runs) KEEP_RUNS=1 ;;
    --backend) BACKEND=$2; shift ;;   # hidden: "cpu" exercises the shardlm plumbing without a GPU
    -h|--help) usage 0 ;;
    -) POS+=("$1") ;;
    -*) echo "gpu_compare.sh: unknown option $1" >&2; usage ;;
    *) POS+=("$1") ;;
  esac
  shift
done
[ ${#POS[@]} -eq 2 ] || usage
RT=${POS[0]} OUT=${POS[1]}

cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/bench_lib.sh
source bench/bench_lib.sh
REPO=$(pwd)
DECK=input/bench/bloom560m.ini
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/bench.log") 2>&1
TEE_PID=$!
START=$(date +%s)
now() { echo $(( $(date +%s) - START )); }
say() { echo "[gpu_compare $(now)s] $*"; }

# NVLink multicast must stay off on shared GPU hosts (also for torchrun's NCCL).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
# A rank that hangs ends the shardlm job after this many seconds instead of the default 600.
export SHARDLM_NCCL_TIMEOUT=${SHARDLM_NCCL_TIMEOUT:-120}

# ---- shape --------------------------------------------------------------------------------
if [ $QUICK = 1 ]; then
  VOCAB=1024 HIDDEN=256 LAYERS=4 HEADS=4 SEQ=128 MB=4
  STEPS=${STEPS:-5} WARMUP=${WARMUP:-2} RUN_TIMEOUT=${RUN_TIMEOUT:-90}
else
  VOCAB=250880 HIDDEN=1024 LAYERS=24 HEADS=16 SEQ=512 MB=8
  STEPS=${STEPS:-30} WARMUP=${WARMUP:-10} RUN_TIMEOUT=${RUN_TIMEOUT:-150}
fi
[ "$STEPS" -gt "$WARMUP" ] || { echo "gpu_compare.sh: --steps must exceed --warmup" >&2; exit 2; }

# ---- GPUs ---------------------------------------------------------------------------------
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
if [ -z "$GPUS" ]; then
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if [ "$GPUS" -lt 1 ]; then
    [ "$BACKEND" = cpu ] && GPUS=2 || { echo "gpu_compare.sh: nvidia-smi lists no GPU" >&2; exit 1; }
  fi
fi
[ "$BACKEND" = cpu ] && GPU_NAME="none (run.backend=cpu: plumbing test, not a measurement)"
say "repo $REPO; $GPUS x ${GPU_NAME:-unknown GPU}; backend $BACKEND"
say "shape: vocab $VOCAB hidden $HIDDEN layers $LAYERS heads $HEADS; seq $SEQ micro-batch $MB; $STEPS steps, $WARMUP warm-up"

# ---- the two sides ------------------------------------------------------------------------
ENVSH=""
if [ $SKIP_SL = 0 ]; then
  if [ "$RT" != - ]; then
    ENVSH=$(cd "$RT" 2>/dev/null && pwd)/env.sh
    [ -f "$ENVSH" ] || { echo "gpu_compare.sh: $RT/env.sh not found (make it with ../shared/device/bundle-runtime)" >&2; exit 1; }
    # Unpack the bundle once, outside the timed runs.
    # shellcheck source=/dev/null
    ( source "$ENVSH" && command -v mpirun >/dev/null ) || { echo "gpu_compare.sh: $ENVSH gives no mpirun" >&2; exit 1; }
  fi
  [ -f "$BIN" ] && [ ! -x "$BIN" ] && chmod +x "$BIN"
  [ -x "$BIN" ] || { echo "gpu_compare.sh: $BIN not found: build it with CUDA first (bench/README.md)" >&2; exit 1; }
  # shellcheck source=/dev/null
  missing=$( { [ -n "$ENVSH" ] && source "$ENVSH"; ldd "$BIN"; } 2>/dev/null | grep 'not found')
  [ -z "$missing" ] || say "warning: $BIN lacks libraries here: $(echo "$missing" | awk '{print $1}' | tr '\n' ' ')"
fi
if [ $SKIP_PT = 0 ]; then
  if ! python3 -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null; then
    say "PyTorch with CUDA and transformers are not importable here: PyTorch runs skipped"
    SKIP_PT=1
  fi
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/shardlm-bench.XXXXXX")
RUNS=$OUT/runs
mkdir -p "$RUNS"
: > "$OUT/bench.jsonl"

# ---- helper: parsing and the table (python3 is on both machines) --------------------------
TOOL=$WORK/bench_tool.py
cat > "$TOOL" <<'PY'
import json, os, statistics, sys

GIB = float(1 << 30)

def shardlm(meta, run_dir, warmup):
    rec = dict(meta)
    train, summary = [], None
    try:
        for line in open(os.path.join(run_dir, "metrics.jsonl")):
            o = json.loads(line)
            if o.get("type") == "train":
                train.append(o)
            elif o.get("type") == "summary":
                summary = o
    except (OSError, ValueError) as e:
        rec.setdefault("error", f"metrics.jsonl: {e}")
    # log_every = 1: one line per step; the first `warmup` steps are left out.
    tps = [o["tokens_per_s_per_rank"] for o in train if o["step"] > warmup]
    if tps:
        rec["tokens_per_s_per_gpu"] = statistics.median(tps)
        rec["tokens_per_s_per_gpu_mean"] = statistics.fmean(tps)
        rec["tokens_per_s_per_gpu_steps"] = [round(v, 1) for v in tps]
    if summary:
        rec["peak_memory_bytes"] = summary["peak_memory_bytes"]
        rec["peak_rss_bytes"] = summary.get("peak_rss_bytes")
        rec["train_loss"] = summary.get("train_loss")
        rec["steps_done"] = summary.get("steps")
    if rec["status"] == "ok" and (not tps or not summary):
        rec["status"] = "no metrics"
    return rec

def pytorch(meta, log):
    rec = dict(meta)
    found = None
    try:
        for line in open(log, errors="replace"):
            if line.startswith('{"impl": "pytorch-fsdp2"'):
                found = json.loads(line)
    except (OSError, ValueError) as e:
        rec.setdefault("error", f"{log}: {e}")
    if found:
        found.pop("impl", None)
        for k, v in found.items():
            rec.setdefault(k, v)
        # The script's own fields win over the runner's for what it measured.
        for k in ("tokens_per_s_per_gpu", "peak_memory_bytes", "gpus"):
            if k in found:
                rec[k] = found[k]
    elif rec["status"] == "ok":
        rec["status"] = "no result line"
    return rec

def cell_tps(r):
    if r is None:
        return "-"
    if r["status"] != "ok":
        return r["status"]
    return f'{r["tokens_per_s_per_gpu"]:,.0f}'

def cell_gib(r, key="peak_memory_bytes"):
    if r is None or r["status"] != "ok" or r.get(key) is None:
        return "-" if r is None or r["status"] == "ok" else r["status"]
    return f"{r[key] / GIB:.2f}"

def ratio(a, b, key):
    if not a or not b or a["status"] != "ok" or b["status"] != "ok" or not a.get(key) or not b.get(key):
        return "-"
    return f"{a[key] / b[key]:.2f}x"

def table(path, title):
    recs = [json.loads(l) for l in open(path) if l.strip()]
    order, by = [], {}
    for r in recs:
        if r["config"] not in by:
            order.append(r["config"])
            by[r["config"]] = {}
        by[r["config"]][r["impl"]] = r
    out = [title, "",
           "| config | GPUs | shardlm tok/s/GPU | PyTorch tok/s/GPU | ratio | shardlm GiB | PyTorch GiB | ratio |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for c in order:
        s, p = by[c].get("shardlm"), by[c].get("pytorch-fsdp2")
        g = (s or p)["gpus"]
        out.append(f"| {(s or p)['label']} | {g} | {cell_tps(s)} | {cell_tps(p)} | "
                   f"{ratio(s, p, 'tokens_per_s_per_gpu')} | {cell_gib(s)} | {cell_gib(p)} | "
                   f"{ratio(s, p, 'peak_memory_bytes')} |")
    extra = [r for r in recs if r.get("nvsmi_peak_bytes") or r.get("peak_reserved_bytes")]
    if extra:
        out += ["", "Whole-process GPU memory (nvidia-smi's memory.used, largest GPU; includes the CUDA "
                "context, NCCL and cuBLAS workspaces, and PyTorch's cached blocks), and PyTorch's "
                "max_memory_reserved, GiB:", "",
                "| config | shardlm nvidia-smi | PyTorch nvidia-smi | ratio | PyTorch reserved |",
                "| --- | ---: | ---: | ---: | ---: |"]
        for c in order:
            s, p = by[c].get("shardlm"), by[c].get("pytorch-fsdp2")
            out.append(f"| {(s or p)['label']} | {cell_gib(s, 'nvsmi_peak_bytes')} | "
                       f"{cell_gib(p, 'nvsmi_peak_bytes')} | {ratio(s, p, 'nvsmi_peak_bytes')} | "
                       f"{cell_gib(p, 'peak_reserved_bytes')} |")
    return "\n".join(out)

if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd in ("shardlm", "pytorch"):
        meta = json.loads(sys.argv[2])
        if cmd == "shardlm":
            rec = shardlm(meta, sys.argv[3], int(sys.argv[4]))
        else:
            rec = pytorch(meta, sys.argv[3])
        if sys.argv[-1]:  # bench_nvsmi_peak's bytes, or empty
            rec["nvsmi_peak_bytes"] = float(sys.argv[-1])
        print(json.dumps(rec))
    elif cmd == "table":
        print(table(sys.argv[2], sys.argv[3]))
PY

# ---- data: every record fills SEQ tokens; enough for STEPS global batches of the most GPUs -
DATA=$WORK/bench_data.jsonl
python3 bench/make_bench_data.py --out "$DATA" --seq "$SEQ" --records $(( STEPS * MB * GPUS )) || exit 1

# ---- configurations: id|label|gpus|strategy|ranks_per_node (hybrid)|activation checkpointing|cpu offload
# (cpu offload 2: shardlm keeps RESIDENT_GIB of the root's optimizer state on the GPU; FSDP2 offloads all)
CONFIGS=()
if [ "$GPUS" -ge 2 ]; then
  CONFIGS+=("full|FULL_SHARD|$GPUS|FULL_SHARD|0|0|0")
fi
CONFIGS+=("single|1 GPU, unsharded|1|NO_SHARD|0|0|0")
if [ "$GPUS" -ge 2 ]; then
  CONFIGS+=("sgo|SHARD_GRAD_OP|$GPUS|SHARD_GRAD_OP|0|0|0")
  if [ "$GPUS" -ge 4 ] && [ $((GPUS % 2)) -eq 0 ]; then
    CONFIGS+=("hybrid|HYBRID_SHARD (2 nodes x $((GPUS / 2)))|$GPUS|HYBRID_SHARD|$((GPUS / 2))|0|0")
  fi
  CONFIGS+=("noshard|NO_SHARD|$GPUS|NO_SHARD|0|0|0")
  CONFIGS+=("full_ac|FULL_SHARD + activation ckpt|$GPUS|FULL_SHARD|0|1|0")
else
  CONFIGS+=("full_ac|1 GPU + activation ckpt|1|NO_SHARD|0|1|0")
fi
CONFIGS+=("offload|1 GPU + CPU offload|1|NO_SHARD|0|0|1")
CONFIGS+=("offload_res|1 GPU + CPU offload + activation ckpt (shardlm: ${RESIDENT_GIB} GiB of the root's state resident)|1|NO_SHARD|0|1|2")

# The default set leaves the offload rows out (they are slow on the PyTorch side); --only names them.
want() { if [ -z "$ONLY" ]; then [[ "$1" != offload* ]]; else [[ ",$ONLY," == *",$1,"* ]]; fi; }

# Time left for the next run, or nothing when the budget is spent.
run_limit() { bench_run_limit $(( BUDGET - $(now) )) "$RUN_TIMEOUT"; }

# After a run that timed out or failed: end what it left on the GPUs (only our own programs,
# by pid), so the next run starts on empty GPUs.
reap() {
  [ "$BACKEND" = cuda ] || return 0
  local line
  while IFS= read -r line; do say "$line"; done < <(bench_reap "$BIN" shardlm fsdp2_bloom.py)
  return 0
}

status_of() {
  case $1 in
    0) echo ok ;;
    124|137) echo timeout ;;
    *) echo "failed (rc $1)" ;;
  esac
}

meta_json() {  # id label gpus strategy impl status rc seconds log
  python3 -c 'import json,sys; a=sys.argv[1:]; print(json.dumps({"config":a[0],"label":a[1],"gpus":int(a[2]),"strategy":a[3],"impl":a[4],"status":a[5],"rc":int(a[6]),"seconds":int(a[7]),"log":a[8]}))' "$@"
}

skip_record() {  # id label gpus strategy impl why
  meta_json "$1" "$2" "$3" "$4" "$5" "$6" -1 0 "" >> "$OUT/bench.jsonl"
}

run_shardlm() {  # id label gpus strategy rpn ac offload
  local id=$1 label=$2 g=$3 strat=$4 rpn=$5 ac=$6 off=$7 name="$1-shardlm"
  local dir=$RUNS/$name limit rc t0 extra=()
  if ! limit=$(run_limit); then say "$name: skipped, time budget spent"; skip_record "$id" "$label" "$g" "$strat" shardlm "skipped (budget)"; return; fi
  mkdir -p "$dir"
  [ "$ac" = 1 ] && extra+=(--fsdp.activation_checkpointing=true)
  [ "$off" != 0 ] && extra+=(--fsdp.cpu_offload=true)
  [ "$off" = 2 ] && extra+=(--fsdp.offload_resident_gib="$RESIDENT_GIB")
  [ "$BACKEND" = cpu ] && extra+=(--run.backend=cpu)
  local mpi=(mpirun -np "$g" --bind-to none)
  [ "$BACKEND" = cpu ] && mpi+=(--oversubscribe)
  local cmd=("${mpi[@]}" "$BIN" train "$DECK"
    --data.train_file="$DATA" --data.max_length="$SEQ"
    --model.vocab_size="$VOCAB" --model.hidden_size="$HIDDEN" --model.num_layers="$LAYERS" --model.num_heads="$HEADS"
    --train.micro_batch_size="$MB" --train.batch_size=$(( MB * g )) --train.max_steps="$STEPS" --train.log_every=1
    --fsdp.strategy="$strat" --dist.ranks_per_node="$rpn"
    --run.dir="$dir" --checkpoint.dir="$WORK/ckpt/$name" --checkpoint.at_end=false "${extra[@]}")
  say "$name: ${cmd[*]} (limit ${limit}s)"
  echo "${cmd[*]}" > "$dir/command.txt"
  bench_nvsmi_start "$dir/nvsmi.csv" "$BACKEND"
  t0=$(date +%s)
  # shellcheck source=/dev/null
  ( [ -n "$ENVSH" ] && source "$ENVSH"; exec timeout -k 20 "$limit" "${cmd[@]}" ) > "$dir/stdout.log" 2>&1
  rc=$?
  bench_nvsmi_stop
  rm -rf "$WORK/ckpt/$name"
  [ $rc = 0 ] || { tail -n 5 "$dir/stdout.log" | sed "s/^/  $name| /"; reap; }
  local meta
  meta=$(meta_json "$id" "$label" "$g" "$strat" shardlm "$(status_of $rc)" "$rc" $(( $(date +%s) - t0 )) "runs/$name/stdout.log")
  python3 "$TOOL" shardlm "$meta" "$dir" "$WARMUP" "$(bench_nvsmi_peak "$dir/nvsmi.csv" "$g")" >> "$OUT/bench.jsonl"
  say "$name: $(status_of $rc) in $(( $(date +%s) - t0 ))s"
}

run_pytorch() {  # id label gpus strategy rpn ac offload
  local id=$1 label=$2 g=$3 strat=$4 rpn=$5 ac=$6 off=$7 name="$1-pytorch"
  local dir=$RUNS/$name limit rc t0 extra=()
  if ! limit=$(run_limit); then say "$name: skipped, time budget spent"; skip_record "$id" "$label" "$g" "$strat" pytorch-fsdp2 "skipped (budget)"; return; fi
  mkdir -p "$dir"
  [ "$ac" = 1 ] && extra+=(--activation-checkpointing)
  [ "$off" != 0 ] && extra+=(--cpu-offload)
  local nodes=2
  [ "$rpn" -gt 0 ] && nodes=$(( g / rpn ))
  local cmd=(python3 -m torch.distributed.run --standalone --nproc-per-node "$g" bench/fsdp2_bloom.py
    --strategy "$strat" --nodes "$nodes" --seq "$SEQ" --micro-batch "$MB" --steps "$STEPS" --warmup "$WARMUP"
    --vocab "$VOCAB" --hidden "$HIDDEN" --layers "$LAYERS" --heads "$HEADS" --label "$label" "${extra[@]}")
  say "$name: ${cmd[*]} (limit ${limit}s)"
  echo "${cmd[*]}" > "$dir/command.txt"
  bench_nvsmi_start "$dir/nvsmi.csv" "$BACKEND"
  t0=$(date +%s)
  timeout -k 20 "$limit" "${cmd[@]}" > "$dir/stdout.log" 2>&1
  rc=$?
  bench_nvsmi_stop
  [ $rc = 0 ] || { tail -n 5 "$dir/stdout.log" | sed "s/^/  $name| /"; reap; }
  local meta
  meta=$(meta_json "$id" "$label" "$g" "$strat" pytorch-fsdp2 "$(status_of $rc)" "$rc" $(( $(date +%s) - t0 )) "runs/$name/stdout.log")
  python3 "$TOOL" pytorch "$meta" "$dir/stdout.log" "$(bench_nvsmi_peak "$dir/nvsmi.csv" "$g")" >> "$OUT/bench.jsonl"
  say "$name: $(status_of $rc) in $(( $(date +%s) - t0 ))s"
}

for c in "${CONFIGS[@]}"; do
  IFS='|' read -r id label g strat rpn ac off <<< "$c"
  want "$id" || continue
  if [ $SKIP_SL = 0 ]; then run_shardlm "$id" "$label" "$g" "$strat" "$rpn" "$ac" "$off"
  else skip_record "$id" "$label" "$g" "$strat" shardlm "not run"; fi
  if [ $SKIP_PT = 0 ]; then run_pytorch "$id" "$label" "$g" "$strat" "$rpn" "$ac" "$off"
  else skip_record "$id" "$label" "$g" "$strat" pytorch-fsdp2 "not run"; fi
done

# ---- the table ----------------------------------------------------------------------------
SHAPE="vocab $VOCAB, hidden $HIDDEN, $LAYERS layers, $HEADS heads"
[ $QUICK = 0 ] && SHAPE="BLOOM-560M ($SHAPE)"
TITLE="shardlm ($BACKEND backend) vs PyTorch FSDP2 on ${GPU_NAME:-?} x $GPUS: $SHAPE; seq $SEQ, micro-batch $MB a GPU, bf16 params, fp32 reduce, AdamW; median over steps $((WARMUP + 1))-$STEPS; ratio = shardlm / PyTorch ($(date -u +%Y-%m-%d))"
python3 "$TOOL" table "$OUT/bench.jsonl" "$TITLE" > "$OUT/bench.md"
echo
cat "$OUT/bench.md"
echo

tar -C "$OUT" -czf "$OUT/runs.tar.gz" runs
[ $KEEP_RUNS = 1 ] || rm -rf "$RUNS"
rm -rf "$WORK"
say "done: $OUT/bench.jsonl, $OUT/bench.md, $OUT/bench.log, $OUT/runs.tar.gz"
# Exit 1 when not a single run came out ok (the table is written all the same).
RC=0
grep -q '"status": "ok"' "$OUT/bench.jsonl" || { say "no run succeeded"; RC=1; }
# Let tee write the last lines of bench.log before the script ends.
exec 1>&- 2>&-
wait "$TEE_PID" 2>/dev/null
exit $RC
