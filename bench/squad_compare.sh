#!/usr/bin/env bash
# squad_compare.sh: the tutorial's path, Hugging Face Trainer fine-tuning BLOOM-560M on a SQuAD
# v1.1 subset, against shardlm's runs of the same workload, on one GPU machine.
#
#   bash bench/squad_compare.sh --bin build-cuda/bin/shardlm [options] RT OUT
#
# RT is the folder made by `../shared/device/bundle-runtime RT build/bin/shardlm` (its env.sh puts
# the bundled OpenMPI, HDF5 and Boost on the paths); "-" uses the mpirun already on PATH. It builds
# nothing and downloads nothing: the data is synthetic SQuAD (bench/make_squad_data.py, 250
# training and 100 dev questions, seed 42), the weights random (BLOOM-560M's shape) on both sides,
# the tokens shardlm's byte tokenizer on both sides (every sample 512 tokens).
#
# Runs, each under a time limit, in this order:
#   hf-1gpu             bench/hf_trainer_squad.py: Trainer, 1 GPU, no sharding (the tutorial's baseline)
#   baseline            shardlm NO_SHARD, 1 rank                  (input/squad/bloom560m-baseline.ini)
#   fsdp-1gpu           shardlm FULL_SHARD over a group of one    (bloom560m-fsdp-1gpu.ini)
#   fsdp-1gpu-offload   the same with fsdp.cpu_offload, --bind-to none (bloom560m-fsdp-1gpu-offload.ini)
#   hf-1gpu-offload     Trainer under torchrun, fsdp "full_shard offload auto_wrap" on 1 GPU (only
#                       with --only naming hf_offload1: it is slow, a host AdamW in PyTorch)
#   fsdp-1gpu-offload-host, -bf16  only with --only naming offload1_host / offload1_bf16: the offload
#                       run with fsdp.offload_accumulate = host / also fsdp.reduce_dtype = bf16
#   with --gpus G > 1, also:
#   hf-fsdp-Ggpu        Trainer under torchrun, fsdp "full_shard auto_wrap" on G GPUs
#   full-shard-Ggpu     shardlm FULL_SHARD on G ranks, train.batch_size 4 x G (the tutorial's way)
#   full-shard-Ggpu-sync  only with --only naming full_sync: the same with fsdp.no_sync = off (every
#                       micro-step gathers and reduces, as before fsdp.no_sync)
# Every shardlm run writes a deck into OUT/decks/ (the tutorial's values, the model as shape keys)
# and its run folder OUT/runs/NAME (no checkpoint; greedy answers to the 100 questions after the
# last epoch, eval.max_new_tokens 50: the model is random, so exact match is about 0). Then
# `shardlm report OUT/runs/...` writes OUT/report.md, OUT/report.csv and OUT/plots/, and the
# script prints OUT/squad.md: samples/s and peak memory of every run and shardlm / HF ratios.
#
# Options:
#   --bin PATH         the shardlm binary (default build/bin/shardlm)
#   --gpus G           GPUs for the extra FULL_SHARD rows (default 1: the one-GPU rows only)
#   --epochs E         epochs of every run (default 2; the tutorial's 5 takes about twice as long)
#   --questions T,D    training and dev questions (default 250,100)
#   --timeout S        limit per run in seconds (default 300: the offload run, about 1.3 s of host
#                      AdamW a step by docs/PERFORMANCE.md, may take about 200 s at 2 epochs)
#   --budget S         stop starting runs when this many seconds have passed (default 480)
#   --only LIST        comma-separated subset of: hf,baseline,fsdp1,offload1,hf_fsdp,full,hf_offload1,
#                      offload1_host,offload1_bf16,full_sync
#   --skip-hf, --skip-shardlm    one side only
#   --quick            a tiny model (vocab 512, hidden 128, 2 layers, 4 heads), 1 epoch: the path
#                      end to end in a minute or two
#   --dry-run          write the data and the decks, print every command, run none
#   --shardlm-args "A" extra deck overrides for every shardlm run (e.g. "--dist.copy_engine_reductions=false")
#   --repeat N         every run N times, the runs interleaved (all of them once, then again): the table
#                      gives each run's median samples/s with the spread, and the G-GPU / 1-GPU ratio
#                      line is taken on the medians (default 1). Repeats' folders are NAME-r2, NAME-r3, ...
set -uo pipefail

usage() { sed -n '2,50p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

BIN=build/bin/shardlm GPUS=1 EPOCHS="" QUESTIONS=250,100 RUN_TIMEOUT=300 BUDGET=480 ONLY=""
SKIP_HF=0 SKIP_SL=0 QUICK=0 DRY=0 BACKEND=cuda SHARDLM_ARGS='' REPEAT=1
POS=()
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift ;;
    --gpus) GPUS=$2; shift ;;
    --epochs) EPOCHS=$2; shift ;;
    --questions) QUESTIONS=$2; shift ;;
    --timeout) RUN_TIMEOUT=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --skip-hf) SKIP_HF=1 ;;
    --skip-shardlm) SKIP_SL=1 ;;
    --quick) QUICK=1 ;;
    --dry-run) DRY=1 ;;
    --shardlm-args) SHARDLM_ARGS=$2; shift ;;
    --repeat) REPEAT=$2; shift ;;
    --backend) BACKEND=$2; shift ;;   # hidden: "cpu" exercises the shardlm plumbing without a GPU
    -h|--help) usage 0 ;;
    -) POS+=("$1") ;;
    -*) echo "squad_compare.sh: unknown option $1" >&2; usage ;;
    *) POS+=("$1") ;;
  esac
  shift
done
[ ${#POS[@]} -eq 2 ] || usage
RT=${POS[0]} OUT=${POS[1]}
IFS=, read -r N_TRAIN N_DEV <<< "$QUESTIONS"
for v in "$GPUS" "$N_TRAIN" "$N_DEV" "$RUN_TIMEOUT" "$BUDGET" "$REPEAT" ${EPOCHS:+"$EPOCHS"}; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "squad_compare.sh: '$v' is not a positive whole number" >&2; exit 2; }
done

cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/bench_lib.sh
source bench/bench_lib.sh
REPO=$(pwd)
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
case $BIN in /*) ;; *) BIN=$REPO/$BIN ;; esac
exec > >(tee "$OUT/squad.log") 2>&1
TEE_PID=$!
START=$(date +%s)
now() { echo $(( $(date +%s) - START )); }
say() { echo "[squad_compare $(now)s] $*"; }

# NVLink multicast must stay off on shared GPU hosts (also for torchrun's NCCL).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
# A rank that hangs ends the shardlm job after this many seconds instead of the default 600.
export SHARDLM_NCCL_TIMEOUT=${SHARDLM_NCCL_TIMEOUT:-120}

# ---- shape and workload (the tutorial's: input/squad/*.ini) ---------------------------------
if [ $QUICK = 1 ]; then
  VOCAB=512 HIDDEN=128 LAYERS=2 HEADS=4 EPOCHS=${EPOCHS:-1}
else
  VOCAB=250880 HIDDEN=1024 LAYERS=24 HEADS=16 EPOCHS=${EPOCHS:-2}
fi
MAX_LEN=512 MICRO=1 ACCUM=4 LR=5e-5 WD=0.01 SEED=42 GEN_TOKENS=50 GEN_BATCH=8

GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
[ "$BACKEND" = cpu ] && GPU_NAME="none (run.backend=cpu: plumbing test, not a measurement)"
say "repo $REPO; ${GPU_NAME:-unknown GPU}; backend $BACKEND; $GPUS GPU(s) for the sharded rows"
say "shape: vocab $VOCAB hidden $HIDDEN layers $LAYERS heads $HEADS; $N_TRAIN train / $N_DEV dev questions, max length $MAX_LEN, $EPOCHS epoch(s), micro-batch $MICRO x accumulation $ACCUM a GPU"

# ---- the two sides ------------------------------------------------------------------------
ENVSH=""
if [ $SKIP_SL = 0 ] && [ $DRY = 0 ]; then
  if [ "$RT" != - ]; then
    ENVSH=$(cd "$RT" 2>/dev/null && pwd)/env.sh
    [ -f "$ENVSH" ] || { echo "squad_compare.sh: $RT/env.sh not found (make it with ../shared/device/bundle-runtime)" >&2; exit 1; }
    # Unpack the bundle once, outside the timed runs.
    # shellcheck source=/dev/null
    ( source "$ENVSH" && command -v mpirun >/dev/null ) || { echo "squad_compare.sh: $ENVSH gives no mpirun" >&2; exit 1; }
  fi
  [ -f "$BIN" ] && [ ! -x "$BIN" ] && chmod +x "$BIN"
  [ -x "$BIN" ] || { echo "squad_compare.sh: $BIN not found: build it with CUDA first (bench/README.md)" >&2; exit 1; }
elif [ "$RT" != - ]; then
  ENVSH=$RT/env.sh
fi
if [ $SKIP_HF = 0 ] && [ $DRY = 0 ]; then
  if ! python3 -c 'import torch, transformers, accelerate; assert torch.cuda.is_available()' 2>/dev/null; then
    say "PyTorch with CUDA, transformers and accelerate are not all importable here: Trainer runs skipped"
    SKIP_HF=1
  fi
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/shardlm-squad.XXXXXX")
DATA=$OUT/data DECKS=$OUT/decks RUNS=$OUT/runs HF=$OUT/hf
mkdir -p "$DATA" "$DECKS" "$RUNS" "$HF"
: > "$OUT/squad.jsonl"

# ---- data: synthetic SQuAD v1.1, the tutorial's subset sizes --------------------------------
say "data: python3 bench/make_squad_data.py --train $N_TRAIN --dev $N_DEV --seed $SEED --out $DATA"
python3 bench/make_squad_data.py --train "$N_TRAIN" --dev "$N_DEV" --seed "$SEED" --out "$DATA" || exit 1

# ---- helper: parsing and the table (python3 is on both machines) --------------------------
TOOL=$WORK/squad_tool.py
cat > "$TOOL" <<'PY'
import json, os, sys

GIB = float(1 << 30)

def shardlm(meta, run_dir, batch):
    rec = dict(meta)
    evals, summary, setup = [], None, None
    try:
        for line in open(os.path.join(run_dir, "metrics.jsonl")):
            o = json.loads(line)
            t = o.get("type")
            if t == "eval":
                evals.append(o)
            elif t == "summary":
                summary = o
            elif t == "setup":
                setup = o
    except (OSError, ValueError) as e:
        rec.setdefault("error", f"metrics.jsonl: {e}")
    rec["eval_loss"] = [e["eval_loss"] for e in evals]
    gen = sum(e.get("eval_generation_runtime", 0.0) for e in evals)
    rec["generation_runtime"] = gen
    for k in ("eval_exact_match", "eval_f1"):
        v = [e[k] for e in evals if k in e]
        if v:
            rec[k] = v[-1]
    if setup:
        rec["steps_per_epoch"] = setup.get("steps_per_epoch")
        rec["grad_accum"] = setup.get("grad_accum")
    if summary:
        for k in ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss",
                  "final_loss", "peak_memory_bytes", "peak_rss_bytes", "tokens_per_second_per_gpu", "steps"):
            rec[k] = summary.get(k)
        # train_runtime spans the whole loop, evaluation and answer generation included; Trainer's
        # spans evaluation but generates nothing: this figure leaves generation out.
        busy = summary["train_runtime"] - gen
        rec["samples_per_second_no_generation"] = summary["steps"] * batch / busy if busy > 0 else None
    if rec["status"] == "ok" and not summary:
        rec["status"] = "no metrics"
    return rec

def hf(meta, result_file):
    rec = dict(meta)
    found = None
    try:
        for line in open(result_file):
            if line.startswith('{"impl": "hf-trainer"'):
                found = json.loads(line)
    except (OSError, ValueError) as e:
        rec.setdefault("error", f"{result_file}: {e}")
    if found:
        found.pop("impl", None)
        found.pop("label", None)
        rec.update({k: v for k, v in found.items() if k != "gpus"})
        rec["samples_per_second_no_generation"] = found.get("train_samples_per_second")
    elif rec["status"] == "ok":
        rec["status"] = "no result line"
    return rec

def num(v, f="{:.2f}"):
    return "-" if v is None else f.format(v)

def ratio(a, b):
    return "-" if not a or not b else f"{a / b:.2f}x"

def median(v):
    v = sorted(v)
    n = len(v)
    return None if n == 0 else (v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2)

def merged(recs):
    # One row per run (config): with --repeat, the median samples/s of its ok repeats and their spread;
    # the other columns from its first ok repeat.
    rows, order = {}, []
    for r in recs:
        if r["config"] not in rows:
            order.append(r["config"])
            rows[r["config"]] = []
        rows[r["config"]].append(r)
    out = []
    for c in order:
        group = rows[c]
        ok = [r for r in group if r["status"] == "ok"]
        row = dict(ok[0] if ok else group[0])
        for k in ("train_samples_per_second", "samples_per_second_no_generation"):
            vals = [r[k] for r in ok if r.get(k) is not None]
            row[k] = median(vals)
            row[k + "_all"] = vals
        row["repeats"] = len(group)
        if len(group) > 1 and len(ok) < len(group):
            row["status"] = f"ok {len(ok)} of {len(group)}" if ok else group[-1]["status"]
        out.append(row)
    return out

def cell(r, k):
    v = r.get(k)
    vals = r.get(k + "_all") or []
    if v is None or len(vals) < 2:
        return num(v)
    return f"{num(v)} ({num(min(vals))}-{num(max(vals))}, {len(vals)} runs)"

def scaling_line(rows):
    # The G-GPU FULL_SHARD run against the 1-GPU one, on the medians: the figure the tutorial's scaling is read from.
    one = next((r for r in rows if r["config"] == "fsdp1" and r["status"].startswith("ok")), None)
    many = next((r for r in rows if r["config"] == "full" and r["status"].startswith("ok")), None)
    if not one or not many:
        return None
    n = min(one["repeats"], many["repeats"])
    what = "medians" if n > 1 else "one run each"
    return (f"FULL_SHARD on {many['gpus']} GPUs against 1 ({what}): "
            f"{ratio(many.get('train_samples_per_second'), one.get('train_samples_per_second'))} samples/s, "
            f"{ratio(many.get('samples_per_second_no_generation'), one.get('samples_per_second_no_generation'))} "
            f"with generation left out")

def table(path, title):
    recs = merged([json.loads(l) for l in open(path) if l.strip()])
    # Trainer's row for each GPU count and offload: what the shardlm rows are set against (an offload
    # row against Trainer's offload run when there is one, else against Trainer without offload).
    base = {}
    for r in recs:
        if r["impl"] == "hf-trainer" and r["status"] == "ok":
            base.setdefault((r["gpus"], bool(r.get("cpu_offload"))), r)
    out = [title, "",
           "| run | GPUs | samples/s | samples/s, generation left out | x HF | peak GiB | x HF | nvidia-smi GiB | eval loss (last) | EM | F1 | status |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in recs:
        ok = r["status"].startswith("ok")
        b = None
        if r["impl"] == "shardlm":
            b = base.get((r["gpus"], bool(r.get("cpu_offload")))) or base.get((r["gpus"], False))
        sps = r.get("train_samples_per_second") if ok else None
        nogen = r.get("samples_per_second_no_generation") if ok else None
        mem = r.get("peak_memory_bytes") if ok else None
        nv = r.get("nvsmi_peak_bytes") if ok else None
        ev = (r.get("eval_loss") or [None])[-1] if ok else None
        sps_cell = cell(r, "train_samples_per_second") if ok else num(None)
        nogen_cell = cell(r, "samples_per_second_no_generation") if ok else num(None)
        out.append(f"| {r['label']} | {r['gpus']} | {sps_cell} | {nogen_cell} | "
                   f"{ratio(nogen, b and b.get('samples_per_second_no_generation'))} | "
                   f"{num(mem and mem / GIB)} | {ratio(mem, b and b.get('peak_memory_bytes'))} | "
                   f"{num(nv and nv / GIB)} | {num(ev, '{:.4f}')} | {num(r.get('eval_exact_match') if ok else None)} | "
                   f"{num(r.get('eval_f1') if ok else None)} | {r['status']} |")
    line = scaling_line(recs)
    if line:
        out += ["", line]
    return "\n".join(out)

if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd in ("shardlm", "hf"):
        meta = json.loads(sys.argv[2])
        rec = shardlm(meta, sys.argv[3], int(sys.argv[4])) if cmd == "shardlm" else hf(meta, sys.argv[3])
        if sys.argv[-1]:  # bench_nvsmi_peak's bytes, or empty
            rec["nvsmi_peak_bytes"] = float(sys.argv[-1])
        print(json.dumps(rec))
    elif cmd == "table":
        print(table(sys.argv[2], sys.argv[3]))
PY

# ---- the shardlm decks: the tutorial's values (input/squad/bloom560m-baseline.ini), the model
# as shape keys (model.dir cannot be combined with them), the byte tokenizer, the synthetic files.
write_deck() {  # name strategy cpu_offload gpus [offload_accumulate [reduce_dtype [no_sync]]]
  local name=$1 strat=$2 offload=$3 g=$4 accumulate=${5:-host} reduce=${6:-fp32} no_sync=${7:-auto}
  local accumulate_line=""
  [ "$offload" = true ] && accumulate_line="offload_accumulate       = $accumulate"
  cat > "$DECKS/$name.ini" <<EOF
# shardlm deck written by bench/squad_compare.sh: run "$name", $g GPU(s), $strat, cpu_offload $offload.
# The tutorial's workload (input/squad/*.ini) on random weights of BLOOM-560M's shape, the byte
# tokenizer and synthetic SQuAD v1.1 files (bench/make_squad_data.py). Paths: data relative to
# this deck's folder; run.dir absolute; checkpoint.dir a temporary folder of the script (no
# checkpoint is written, but a run stopped by the script's time limit would write one there).
[model]
arch           = bloom
vocab_size     = $VOCAB
hidden_size    = $HIDDEN
num_layers     = $LAYERS
num_heads      = $HEADS
layer_norm_eps = 1e-5
init_std       = 0.02

[data]
format     = squad
train_file = ../data/train-v1.1.json
eval_file  = ../data/dev-v1.1.json
max_length = $MAX_LEN
train_size = 0             # every record: the files hold exactly the subset ($N_TRAIN / $N_DEV)
eval_size  = 0
tokenizer  = byte

[train]
epochs           = $EPOCHS
batch_size       = $(( MICRO * ACCUM * g ))     # global: $g GPU(s) x micro-batch $MICRO x accumulation $ACCUM
micro_batch_size = $MICRO
lr               = $LR
weight_decay     = $WD
warmup_steps     = 0
lr_schedule      = linear
adam_beta1       = 0.9
adam_beta2       = 0.999
adam_eps         = 1e-8
max_grad_norm    = 1.0
loss_scale       = 0
seed             = $SEED
shuffle          = true
log_every        = 5
max_steps        = 0

[fsdp]
strategy                 = $strat
param_dtype              = bf16
reduce_dtype             = $reduce
activation_checkpointing = false
cpu_offload              = $offload
no_sync                  = $no_sync
$accumulate_line

[eval]
generate       = end       # greedy answers to every dev question after the last epoch
max_new_tokens = $GEN_TOKENS
batch_size     = $GEN_BATCH         # prompts decoded together

[dist]
ranks_per_node = 0

[checkpoint]
dir    = $WORK/ckpt/$name
every  = 0
at_end = false             # a measurement: no checkpoint

[run]
dir     = $RUNS/$name
backend = $BACKEND
EOF
}

# ---- runs: id|name|label|impl|gpus|strategy|cpu_offload -------------------------------------
ROWS=("hf|hf-1gpu|HF Trainer, 1 GPU, no sharding|hf-trainer|1|none|false"
      "baseline|baseline|shardlm baseline: NO_SHARD, 1 GPU|shardlm|1|NO_SHARD|false"
      "fsdp1|fsdp-1gpu|shardlm FULL_SHARD, 1 GPU|shardlm|1|FULL_SHARD|false"
      "offload1|fsdp-1gpu-offload|shardlm FULL_SHARD + cpu_offload (sums on the GPU), 1 GPU|shardlm|1|FULL_SHARD|true")
# Variants of the offload row (which sums the micro-steps on the GPU, as the tutorial's offload deck:
# fsdp.offload_accumulate = device), only when --only names them: the sums on the host
# (offload_accumulate = host: the least GPU memory), and that with a bf16 reduction (HF Trainer's
# bf16 = True reduces in bf16).
if [[ ",$ONLY," == *",offload1_host,"* ]]; then
  ROWS+=("offload1_host|fsdp-1gpu-offload-host|shardlm FULL_SHARD + cpu_offload, sums on the host, 1 GPU|shardlm|1|FULL_SHARD|true")
fi
if [[ ",$ONLY," == *",offload1_bf16,"* ]]; then
  ROWS+=("offload1_bf16|fsdp-1gpu-offload-bf16|shardlm FULL_SHARD + cpu_offload, sums on the host, bf16 reduction, 1 GPU|shardlm|1|FULL_SHARD|true")
fi
if [[ ",$ONLY," == *",hf_offload1,"* ]]; then
  ROWS+=("hf_offload1|hf-1gpu-offload|HF Trainer + FSDP full_shard offload, 1 GPU|hf-trainer|1|FULL_SHARD|true")
fi
if [ "$GPUS" -gt 1 ]; then
  ROWS+=("hf_fsdp|hf-fsdp-${GPUS}gpu|HF Trainer + FSDP full_shard, $GPUS GPUs|hf-trainer|$GPUS|FULL_SHARD|false"
         "full|full-shard-${GPUS}gpu|shardlm FULL_SHARD, $GPUS GPUs|shardlm|$GPUS|FULL_SHARD|false")
  # Only when --only names it: every micro-step reducing (fsdp.no_sync = off), as before no_sync.
  if [[ ",$ONLY," == *",full_sync,"* ]]; then
    ROWS+=("full_sync|full-shard-${GPUS}gpu-sync|shardlm FULL_SHARD, every micro-step reducing, $GPUS GPUs|shardlm|$GPUS|FULL_SHARD|false")
  fi
fi

want() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }

# Time left for the next run, or nothing when the budget is spent.
run_limit() { bench_run_limit $(( BUDGET - $(now) )) "$RUN_TIMEOUT"; }

# After a run that timed out or failed: end what it left on the GPUs (only our own programs,
# by pid), so the next run starts on empty GPUs.
reap() {
  [ "$BACKEND" = cuda ] || return 0
  local line
  while IFS= read -r line; do say "$line"; done < <(bench_reap "$BIN" hf_trainer_squad.py)
  return 0
}

# A command line as the shell would read it back (labels hold spaces).
quoted() {
  local out="" w
  for w in "$@"; do out+="${out:+ }$(printf '%q' "$w")"; done
  echo "$out"
}

status_of() {
  case $1 in
    0) echo ok ;;
    124|137) echo timeout ;;
    *) echo "failed (rc $1)" ;;
  esac
}

meta_json() {  # id name label impl gpus strategy offload status rc seconds log [repeat]
  python3 -c 'import json,sys; a=sys.argv[1:]; print(json.dumps({"config":a[0],"name":a[1],"label":a[2],"impl":a[3],"gpus":int(a[4]),"strategy":a[5],"cpu_offload":a[6]=="true","status":a[7],"rc":int(a[8]),"seconds":int(a[9]),"log":a[10],"repeat":int(a[11]) if len(a) > 11 else 1}))' "$@"
}

# One run of either side: the command, its log, its limit, its record in squad.jsonl.
run_one() {  # id name label impl gpus strategy offload [repeat]
  local id=$1 name=$2 label=$3 impl=$4 g=$5 strat=$6 offload=$7 rep=${8:-1}
  local dir limit rc t0 meta cmd=() envs=()
  [ "$rep" -gt 1 ] && name=$name-r$rep
  if [ "$impl" = hf-trainer ]; then
    dir=$HF/$name
    if [ "$g" -gt 1 ] || [ "$offload" = true ]; then
      cmd=(python3 -m torch.distributed.run --standalone --nproc-per-node "$g" bench/hf_trainer_squad.py --fsdp)
      [ "$offload" = true ] && cmd+=(--fsdp-offload)
      [ "$g" -eq 1 ] && envs=(CUDA_VISIBLE_DEVICES=0)
    else
      # Without torchrun Trainer takes every visible GPU (DataParallel): show it one.
      envs=(CUDA_VISIBLE_DEVICES=0)
      cmd=(python3 bench/hf_trainer_squad.py)
    fi
    cmd+=(--train "$DATA/train-v1.1.json" --dev "$DATA/dev-v1.1.json" --epochs "$EPOCHS"
      --max-length "$MAX_LEN" --micro-batch "$MICRO" --grad-accum "$ACCUM" --eval-batch 1
      --lr "$LR" --weight-decay "$WD" --seed "$SEED"
      --vocab "$VOCAB" --hidden "$HIDDEN" --layers "$LAYERS" --heads "$HEADS"
      --label "$label" --out "$dir/result.json")
  else
    dir=$RUNS/$name
    local accumulate=device reduce=fp32 no_sync=auto  # the tutorial's offload deck sums on the GPU
    [ "$id" = offload1_host ] || [ "$id" = offload1_bf16 ] && accumulate=host
    [ "$id" = offload1_bf16 ] && reduce=bf16
    [ "$id" = full_sync ] && no_sync=off
    write_deck "$name" "$strat" "$offload" "$g" "$accumulate" "$reduce" "$no_sync"
    cmd=(mpirun -np "$g" --bind-to none)
    [ "$BACKEND" = cpu ] && cmd+=(--oversubscribe)
    [ "$(id -u)" = 0 ] && cmd+=(--allow-run-as-root)
    cmd+=("$BIN" train "$DECKS/$name.ini")
    # shellcheck disable=SC2206  # word-split on purpose: several overrides in one argument
    [ -n "$SHARDLM_ARGS" ] && cmd+=($SHARDLM_ARGS)
  fi
  local shown
  shown=$(quoted "${envs[@]}" "${cmd[@]}")
  if [ $DRY = 1 ]; then
    if [ "$impl" = shardlm ]; then
      echo "${ENVSH:+source $ENVSH && }$shown    # deck: $DECKS/$name.ini"
    else
      echo "$shown"
    fi
    return
  fi
  if ! limit=$(run_limit); then
    say "$name: skipped, time budget spent"
    meta_json "$id" "$name" "$label" "$impl" "$g" "$strat" "$offload" "skipped (budget)" -1 0 "" "$rep" >> "$OUT/squad.jsonl"
    return
  fi
  mkdir -p "$dir"
  say "$name: $shown (limit ${limit}s)"
  echo "$shown" > "$dir/command.txt"
  bench_nvsmi_start "$dir/nvsmi.csv" "$BACKEND"
  t0=$(date +%s)
  if [ "$impl" = hf-trainer ]; then
    env "${envs[@]}" timeout -k 20 "$limit" "${cmd[@]}" > "$dir/stdout.log" 2>&1
  else
    # shellcheck source=/dev/null
    ( [ -n "$ENVSH" ] && source "$ENVSH"; exec timeout -k 20 "$limit" "${cmd[@]}" ) > "$dir/stdout.log" 2>&1
  fi
  rc=$?
  bench_nvsmi_stop
  rm -rf "$WORK/ckpt/$name"
  [ $rc = 0 ] || { tail -n 5 "$dir/stdout.log" | sed "s/^/  $name| /"; reap; }
  meta=$(meta_json "$id" "$name" "$label" "$impl" "$g" "$strat" "$offload" "$(status_of $rc)" "$rc" $(( $(date +%s) - t0 )) "${dir#"$OUT"/}/stdout.log" "$rep")
  if [ "$impl" = hf-trainer ]; then
    python3 "$TOOL" hf "$meta" "$dir/result.json" "$(bench_nvsmi_peak "$dir/nvsmi.csv" "$g")" >> "$OUT/squad.jsonl"
  else
    python3 "$TOOL" shardlm "$meta" "$dir" $(( MICRO * ACCUM * g )) "$(bench_nvsmi_peak "$dir/nvsmi.csv" "$g")" >> "$OUT/squad.jsonl"
  fi
  say "$name: $(status_of $rc) in $(( $(date +%s) - t0 ))s"
}

# --repeat: every run once, then all of them again, so that a drift of the machine touches every run alike.
for ((rep = 1; rep <= REPEAT; rep++)); do
  for r in "${ROWS[@]}"; do
    IFS='|' read -r id name label impl g strat offload <<< "$r"
    want "$id" || continue
    if { [ "$impl" = hf-trainer ] && [ $SKIP_HF = 1 ]; } || { [ "$impl" = shardlm ] && [ $SKIP_SL = 1 ]; }; then
      [ $DRY = 1 ] || [ "$rep" -gt 1 ] || meta_json "$id" "$name" "$label" "$impl" "$g" "$strat" "$offload" "not run" -1 0 "" >> "$OUT/squad.jsonl"
      continue
    fi
    run_one "$id" "$name" "$label" "$impl" "$g" "$strat" "$offload" "$rep"
  done
done

# ---- shardlm report over the runs that left a deck and metrics -----------------------------
# In the order of the runs (the first is the report's speed-up reference), those that started.
REPORT_DIRS=()
for r in "${ROWS[@]}"; do
  IFS='|' read -r id name _ impl _ <<< "$r"
  d=$RUNS/$name
  if [ "$impl" = shardlm ] && want "$id" && [ $SKIP_SL = 0 ]; then
    # shardlm report stops at a run without a setup record (one killed while it started).
    if [ $DRY = 1 ] || { [ -f "$d/deck.resolved.ini" ] && grep -qs '"setup"' "$d/metrics.jsonl"; }; then REPORT_DIRS+=("$d"); fi
  fi
done
REPORT_CMD=("$BIN" report "${REPORT_DIRS[@]}" --csv "$OUT/report.csv" --svg "$OUT/plots")
if [ $DRY = 1 ]; then
  echo "${ENVSH:+source $ENVSH && }$(quoted "${REPORT_CMD[@]}")"
  rm -rf "$WORK"
  say "dry run: data in $DATA, decks in $DECKS; nothing was run"
  exec 1>&- 2>&-
  wait "$TEE_PID" 2>/dev/null
  exit 0
fi
if [ ${#REPORT_DIRS[@]} -gt 0 ]; then
  say "report: ${REPORT_CMD[*]}"
  # shellcheck source=/dev/null
  ( [ -n "$ENVSH" ] && source "$ENVSH"; exec "${REPORT_CMD[@]}" ) > "$OUT/report.md" 2>&1 || say "shardlm report failed: $(tail -n 2 "$OUT/report.md")"
  cat "$OUT/report.md"
fi

# ---- the table ----------------------------------------------------------------------------
SHAPE="vocab $VOCAB, hidden $HIDDEN, $LAYERS layers, $HEADS heads"
[ $QUICK = 0 ] && SHAPE="BLOOM-560M ($SHAPE)"
TITLE="SQuAD tutorial path, HF Trainer vs shardlm ($BACKEND backend) on ${GPU_NAME:-?}: $SHAPE, random init; synthetic SQuAD v1.1, $N_TRAIN train / $N_DEV dev questions, byte tokens (max length $MAX_LEN); $EPOCHS epoch(s), micro-batch $MICRO x accumulation $ACCUM a GPU, lr $LR, weight decay $WD, bf16; x HF = shardlm / HF Trainer on as many GPUs, an offload row against Trainer's offload row if it ran ($(date -u +%Y-%m-%d))"
python3 "$TOOL" table "$OUT/squad.jsonl" "$TITLE" > "$OUT/squad.md"
echo
cat "$OUT/squad.md"
echo

rm -rf "$WORK"
say "done: the table in $OUT/squad.md; records, logs, report and run folders beside it"
# Exit 1 when not a single run came out ok (the table is written all the same).
RC=0
grep -q '"status": "ok"' "$OUT/squad.jsonl" || { say "no run succeeded"; RC=1; }
# Let tee write the last lines of squad.log before the script ends.
exec 1>&- 2>&-
wait "$TEE_PID" 2>/dev/null
exit $RC
