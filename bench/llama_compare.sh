#!/usr/bin/env bash
# llama_compare.sh: shardlm against PyTorch FSDP2 (eager, and with torch.compile) on Llama shapes,
# one GPU, in one command. Each row trains the same shape, sequence length and micro-batch on both
# sides with random weights (bf16 parameters, fp32 reduction and master, AdamW, clipping 1.0) and
# records tokens/s (median over the steps after the warm-up) and peak GPU memory.
#
#   bash bench/llama_compare.sh [--bin build/bin/shardlm] [--steps 10] [--warmup 4] [--gpus 1]
#                               [--sides shardlm,eager,compile] [--timeout 240] [--lora R:ALPHA]
#                               [--strategy FULL_SHARD] [--nodes N] [--trace-step K] [--rt RT]
#                               [--deadline EPOCH] [--dry-run] ROW... OUT
#
# --gpus G (default 1) runs every row FULL_SHARD on G GPUs of this machine on both sides (shardlm
# under mpirun -np G, FSDP2 under torchrun (python3 -m torch.distributed.run) --nproc-per-node G), MICRO samples per GPU; tokens/s and
# memory are per GPU. The PEFT side is one GPU only.
#
# --lora R:ALPHA trains LoRA adapters (rank R, alpha ALPHA, every linear layer of the blocks, the base
# frozen) on both sides instead: shardlm with [lora], and transformers + PEFT (bench/peft_lora.py:
# bf16 base, fp32 adapters under bf16 autocast, torch AdamW) as the side "peft" (the default sides
# become shardlm,peft).
#
# --strategy HYBRID_SHARD --nodes N (G GPUs): N emulated nodes of G/N consecutive ranks, shardlm's
# --dist.ranks_per_node=G/N against FSDP2's HSDP mesh (replicate N, shard G/N). Default FULL_SHARD.
# --trace-step K records step K's timeline on both sides (shardlm --run.trace_step=K; FSDP2
# --profile-step K under torch.profiler) and adds its summary (bench/trace_summary.py: compute,
# exposed communication, optimizer) to each record as "timeline".
# --rt RT sources RT/env.sh (the bundled OpenMPI) around each mpirun only, so PyTorch keeps its own
# libraries; without it, run with the shardlm runtime already on the paths. Every NCCL_* variable set
# when the script starts goes to the shardlm ranks (mpirun -x) and to torchrun alike.
# --deadline EPOCH (date +%s): start no run with less than 30 s left, and end none later.
# --dry-run prints every command (and writes the records and table with status "dry run").
# --shardlm-args "ARGS" appends deck overrides to every shardlm run (word-split), e.g. for a smoke test
# on this machine: "--run.backend=cpu --model.hidden_size=64 ..." (bench/README.md).
#
# A ROW is label=DECK:LAYERS:SEQ:MICRO[:ac], e.g. llama8b-2k=input/bench/llama31-8b.ini:4:2048:8
# (the deck gives the shape, BLOOM or any Llama-style family; LAYERS replaces its layer count so the model fits;
# ":ac" turns activation checkpointing on for both sides). OUT gets llama.jsonl, llama.md, one log
# per run (its first line the command) and, with --trace-step, the run folders' timelines.
set -uo pipefail
BIN=build/bin/shardlm STEPS=10 WARMUP=4 SIDES="" RUN_TIMEOUT=240 LORA="" GPUS=1
STRATEGY=FULL_SHARD NODES=2 TRACE_STEP=0 RT="" DEADLINE=0 DRY=0 SHARDLM_ARGS=""
POS=()
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --sides) SIDES=$2; shift ;;
    --timeout) RUN_TIMEOUT=$2; shift ;;
    --lora) LORA=$2; shift ;;
    --gpus) GPUS=$2; shift ;;
    --strategy) STRATEGY=$2; shift ;;
    --nodes) NODES=$2; shift ;;
    --trace-step) TRACE_STEP=$2; shift ;;
    --rt) RT=$2; shift ;;
    --deadline) DEADLINE=$2; shift ;;
    --dry-run) DRY=1 ;;
    --shardlm-args) SHARDLM_ARGS=$2; shift ;;
    -*) echo "llama_compare.sh: unknown option $1" >&2; exit 2 ;;
    *) POS+=("$1") ;;
  esac
  shift
done
[ ${#POS[@]} -ge 2 ] || { sed -n '2,41p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $GPUS =~ ^[1-9][0-9]*$ ]] || { echo "llama_compare.sh: --gpus wants a positive count, not '$GPUS'" >&2; exit 2; }
if ! [[ $TRACE_STEP =~ ^[0-9]+$ ]] || [ "$TRACE_STEP" -gt "$STEPS" ]; then
  echo "llama_compare.sh: --trace-step wants 0 (off) to --steps ($STEPS)" >&2; exit 2
fi
RPN=0
case $STRATEGY in
  FULL_SHARD|SHARD_GRAD_OP|NO_SHARD) ;;
  HYBRID_SHARD|HYBRID_SHARD_ZERO2)
    if ! [[ $NODES =~ ^[1-9][0-9]*$ ]] || [ $((GPUS % NODES)) != 0 ]; then
      echo "llama_compare.sh: --nodes $NODES does not divide --gpus $GPUS" >&2; exit 2
    fi
    RPN=$((GPUS / NODES)) ;;
  *) echo "llama_compare.sh: unknown --strategy $STRATEGY" >&2; exit 2 ;;
esac
ENVSH=""
if [ -n "$RT" ] && [ "$RT" != - ]; then
  ENVSH=$(cd "$RT" 2>/dev/null && pwd)/env.sh
  [ -f "$ENVSH" ] || [ $DRY = 1 ] || { echo "llama_compare.sh: $RT/env.sh not found" >&2; exit 2; }
fi
LORA_FLAGS=() PEFT_FLAGS=()
if [ -n "$LORA" ]; then
  LORA_FLAGS=(--lora.r="${LORA%%:*}" --lora.alpha="${LORA#*:}" --lora.target_modules=all-linear)
  PEFT_FLAGS=(--r "${LORA%%:*}" --alpha "${LORA#*:}")
  SIDES=${SIDES:-shardlm,peft}
fi
SIDES=${SIDES:-shardlm,eager,compile}
if [ "$GPUS" -gt 1 ] && [[ ",$SIDES," == *",peft,"* ]]; then
  echo "llama_compare.sh: the PEFT side runs on one GPU only (--gpus $GPUS)" >&2; exit 2
fi
OUT=${POS[-1]}
unset 'POS[${#POS[@]}-1]'
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/bench_lib.sh
source bench/bench_lib.sh
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
JSONL=$OUT/llama.jsonl
: > "$JSONL"
# NVLink multicast stays off on shared GPU hosts (both sides); a hung rank ends the shardlm job.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SHARDLM_NCCL_TIMEOUT=${SHARDLM_NCCL_TIMEOUT:-120}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
want() { [[ ",$SIDES," == *",$1,"* ]]; }
# The NCCL_* settings of this environment, passed on to the shardlm ranks explicitly.
MPI_X=()
while IFS= read -r v; do MPI_X+=(-x "$v"); done < <(env | sed -n 's/^\(NCCL_[A-Za-z0-9_]*\)=.*/\1/p' | sort)
NCCL_ENV=$(env | grep '^NCCL_' | sort | tr '\n' ' ')
[ -n "$NCCL_ENV" ] && echo "llama_compare.sh: NCCL settings for both sides: $NCCL_ENV"

# The seconds a run may take now (the --timeout, or what the --deadline leaves); fails when < 30.
run_limit() {
  [ "$DEADLINE" -gt 0 ] || { echo "$RUN_TIMEOUT"; return 0; }
  bench_run_limit $(( DEADLINE - $(date +%s) )) "$RUN_TIMEOUT"
}

# run_bounded LOG CMD...: print the command (here and as the log's first line), run it under the
# time limit (the runtime's env.sh sourced around mpirun only), print its status word; after a
# failure, end what the run left on the GPUs (bench_lib.sh's bench_reap).
run_bounded() {
  local log=$1 limit rc; shift
  if ! limit=$(run_limit); then echo "skipped (budget)"; echo "+ skipped (budget): $*" > "$log"; return; fi
  echo "+ $* (limit ${limit}s)" >&2
  echo "+ $*" > "$log"
  [ $DRY = 1 ] && { echo "dry run"; return; }
  # shellcheck source=/dev/null
  if [ "$1" = mpirun ] && [ -n "$ENVSH" ]; then
    ( source "$ENVSH" && exec timeout -k 20 "$limit" "$@" ) >> "$log" 2>&1
  else
    timeout -k 20 "$limit" "$@" >> "$log" 2>&1
  fi
  rc=$?
  # A run that failed or timed out may leave ranks on the GPUs: end them before the next.
  [ $rc = 0 ] || bench_reap "$BIN" fsdp2_bloom.py peft_lora.py >&2
  case $rc in 0) echo ok ;; 124|137) echo timeout ;; *) echo "failed (rc $rc)" ;; esac
}

# The deck's shape as fsdp2_bloom.py flags (BLOOM or a Llama-style family; peft: peft_lora.py's, Llama only).
shape_flags() {
  python3 - "$1" "${2:-fsdp2}" <<'PY'
import configparser, sys
c = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
c.read(sys.argv[1])
m = c["model"]
arch = m.get("arch", "llama").strip()
flags = f"--vocab {m['vocab_size']} --hidden {m['hidden_size']} --heads {m['num_heads']}"
if arch == "bloom":
    print(f"--arch bloom {flags}")
else:
    flags += (f" --kv-heads {m.get('num_kv_heads', m['num_heads'])} --intermediate {m['intermediate_size']}"
              f" --rope-theta {float(m['rope_theta'])}")
    if sys.argv[2] == "peft":
        print(flags)
    else:
        # The families' own shape keys (deck key: fsdp2_bloom.py flag).
        extra = {"head_dim": "--head-dim", "sliding_window": "--sliding-window",
                 "sliding_window_pattern": "--sliding-window-pattern", "rope_local_theta": "--rope-local-theta",
                 "query_pre_attn_scalar": "--query-pre-attn-scalar", "rms_norm_eps": "--rms-eps"}
        for key, flag in extra.items():
            if m.get(key, "").strip():
                flags += f" {flag} {m[key].strip()}"
        tie = m.get("tie_word_embeddings", "false").strip().lower() in ("true", "1", "yes", "on")
        print(f"--arch {arch} {flags}" + (" --tie-embeddings" if tie else ""))
PY
}

record() {  # label side status seconds log run_dir|-
  python3 - "$@" "$WARMUP" "$GPU" "$GPUS" "$STRATEGY" "$RPN" "$TRACE_STEP" >> "$JSONL" <<'PY'
import json, os, statistics, sys
sys.path.insert(0, "bench")
label, side, status, seconds, log, run_dir, warmup, gpu, gpus, strategy, rpn, trace_step = sys.argv[1:13]
rec = {"label": label, "side": side, "status": status, "seconds": int(seconds), "gpu": gpu, "gpus": int(gpus),
       "strategy": strategy if int(gpus) > 1 else "FULL_SHARD (1 GPU)"}
if int(rpn) > 0:
    rec["ranks_per_node"] = int(rpn)
    rec["nodes"] = int(gpus) // int(rpn)
nccl = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
if nccl:
    rec["nccl_env"] = nccl
try:
    with open(log, errors="replace") as f:
        first = f.readline()
        text = first + f.read()
    if first.startswith("+ ") and not first.startswith("+ skipped"):
        rec["command"] = first[2:].rstrip("\n")
    # With NCCL_DEBUG=INFO, NCCL names the transport each channel uses.
    if "NCCL INFO" in text:
        rec["nccl_transports"] = sorted({t for t in ("NET/Socket", "NET/IB", "P2P", "SHM", "CollNet", "NVLS")
                                         if f"via {t}" in text})
except OSError:
    text = ""
if side == "shardlm" and run_dir != "-":
    train, summary = [], {}
    try:
        for line in open(os.path.join(run_dir, "metrics.jsonl")):
            o = json.loads(line)
            if o.get("type") == "train": train.append(o)
            if o.get("type") == "summary": summary = o
    except OSError:
        pass
    tps = [o["tokens_per_s_per_rank"] for o in train if o["step"] > int(warmup)]
    if tps: rec["tokens_per_s_per_gpu"] = statistics.median(tps)
    if summary:
        rec["peak_memory_bytes"] = summary["peak_memory_bytes"]
        rec["attention"] = summary.get("attention")
        rec["train_loss"] = summary.get("train_loss")
    trace = os.path.join(run_dir, f"trace_step{trace_step}_rank0.json")
    if int(trace_step) > 0 and os.path.isfile(trace):
        try:
            import trace_summary
            with open(trace) as f:
                tl = trace_summary.summarize(
                    json.load(f), trace_summary.step_ms_from_metrics(os.path.join(run_dir, "metrics.jsonl"), 0))
            tl.update(step=int(trace_step), file=trace)
        except Exception as e:
            tl = {"error": f"{type(e).__name__}: {e}", "file": trace}
        rec["timeline"] = tl
else:
    for line in text.splitlines():
        if line.startswith('{"impl": "pytorch-fsdp2"') or line.startswith('{"impl": "peft-lora"'):
            o = json.loads(line)
            rec.update(tokens_per_s_per_gpu=o["tokens_per_s_per_gpu"], peak_memory_bytes=o["peak_memory_bytes"],
                       torch=o.get("torch"), compile=o.get("compile"))
            if o.get("peak_reserved_bytes"):
                rec["peak_reserved_bytes"] = o["peak_reserved_bytes"]
            if o.get("timeline"):
                rec["timeline"] = o["timeline"]
if status == "ok" and "tokens_per_s_per_gpu" not in rec: rec["status"] = "no result"
if status != "ok":
    lines = [l.strip() for l in text.splitlines()[1:] if l.strip() and not l.startswith("---")]
    said = [l for l in lines if "error" in l.lower() and "NCCL INFO" not in l][-2:]
    tail = said + [l for l in lines[-2:] if l not in said]
    if tail and status != "dry run" and not status.startswith("skipped"):
        rec["error"] = " | ".join(tail)[-600:]
print(json.dumps(rec))
PY
}

for row in "${POS[@]}"; do
  label=${row%%=*}
  IFS=: read -r deck layers seq micro ac <<< "${row#*=}"
  acflag=false; [ "${ac:-}" = ac ] && acflag=true
  data=$OUT/data_${seq}_$((STEPS * micro * GPUS)).jsonl  # enough records for this row's steps
  [ -f "$data" ] || python3 bench/make_bench_data.py --out "$data" --seq "$seq" --records $((STEPS * micro * GPUS)) >/dev/null || exit 1
  echo "== $label: $deck, $layers layers, seq $seq, micro-batch $micro per GPU, $GPUS GPU(s), $STRATEGY$([ $RPN -gt 0 ] && echo " ($((GPUS / RPN)) nodes x $RPN)"), activation checkpointing $acflag"
  if want shardlm; then
    run=$OUT/run_$label log=$OUT/${label}_shardlm.log t0=$(date +%s) extra=()
    [ "$TRACE_STEP" -gt 0 ] && extra+=(--run.trace_step="$TRACE_STEP")
    [ $RPN -gt 0 ] && extra+=(--dist.ranks_per_node="$RPN")
    read -r -a more <<< "$SHARDLM_ARGS"; extra+=("${more[@]}")
    st=$(run_bounded "$log" mpirun -np "$GPUS" --bind-to none "${MPI_X[@]}" "$BIN" train "$deck" --data.train_file="$data" \
      --model.num_layers="$layers" --data.max_length="$seq" --train.micro_batch_size="$micro" \
      --train.batch_size=$((micro * GPUS)) --fsdp.strategy="$STRATEGY" --train.max_steps="$STEPS" --train.log_every=1 \
      --fsdp.activation_checkpointing="$acflag" --checkpoint.at_end=false --run.dir="$run" "${extra[@]}" "${LORA_FLAGS[@]}")
    record "$label" shardlm "$st" $(( $(date +%s) - t0 )) "$log" "$run"
    tail -1 "$JSONL"
  fi
  if want peft; then
    log=$OUT/${label}_peft.log t0=$(date +%s) extra=()
    [ "$acflag" = true ] && extra=(--activation-checkpointing)
    # shellcheck disable=SC2046
    st=$(run_bounded "$log" python3 bench/peft_lora.py $(shape_flags "$deck" peft) "${PEFT_FLAGS[@]}" --layers "$layers" \
      --seq "$seq" --micro-batch "$micro" --steps "$STEPS" --warmup "$WARMUP" --label "$label" "${extra[@]}")
    record "$label" peft "$st" $(( $(date +%s) - t0 )) "$log" -
    tail -1 "$JSONL"
  fi
  for side in eager compile; do
    want $side || continue
    log=$OUT/${label}_$side.log t0=$(date +%s)
    extra=(); [ $side = compile ] && extra+=(--compile); [ "$acflag" = true ] && extra+=(--activation-checkpointing)
    [ "$TRACE_STEP" -gt 0 ] && extra+=(--profile-step "$TRACE_STEP" --profile-dir "$OUT/profile_${label}_$side")
    [ $RPN -gt 0 ] && extra+=(--nodes "$NODES")
    # shellcheck disable=SC2046
    st=$(run_bounded "$log" python3 -m torch.distributed.run --standalone --nproc-per-node "$GPUS" bench/fsdp2_bloom.py --strategy "$STRATEGY" \
      $(shape_flags "$deck") --layers "$layers" --seq "$seq" --micro-batch "$micro" --steps "$STEPS" \
      --warmup "$WARMUP" --label "$label" "${extra[@]}")
    record "$label" "$side" "$st" $(( $(date +%s) - t0 )) "$log" -
    tail -1 "$JSONL"
  done
done

python3 - "$JSONL" > "$OUT/llama.md" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = {}
for r in recs:
    rows.setdefault(r["label"], {})[r["side"]] = r
def tps(r): return f'{r["tokens_per_s_per_gpu"]:,.0f}' if r and "tokens_per_s_per_gpu" in r else (r["status"] if r else "-")
def gib(r): return f'{r["peak_memory_bytes"] / 2**30:.2f}' if r and r.get("peak_memory_bytes") else "-"
def ratio(a, b, k):
    return f"{a[k] / b[k]:.2f}x" if a and b and a.get(k) and b.get(k) else "-"
if any("peft" in g for g in rows.values()):
    print("| row | shardlm tok/s | PEFT tok/s | ratio | shardlm GiB | PEFT GiB | memory ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, g in rows.items():
        s, q = g.get("shardlm"), g.get("peft")
        print(f"| {label} | {tps(s)} | {tps(q)} | {ratio(s, q, 'tokens_per_s_per_gpu')} | {gib(s)} | {gib(q)} | "
              f"{ratio(s, q, 'peak_memory_bytes')} |")
    sys.exit(0)
print("| row | GPUs | shardlm tok/s/GPU | FSDP2 eager | FSDP2 compile | vs eager | vs compile | shardlm GiB | eager GiB | compile GiB |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for label, g in rows.items():
    s, e, c = g.get("shardlm"), g.get("eager"), g.get("compile")
    print(f"| {label} | {(s or e or c or {}).get('gpus', 1)} | {tps(s)} | {tps(e)} | {tps(c)} | {ratio(s, e, 'tokens_per_s_per_gpu')} | "
          f"{ratio(s, c, 'tokens_per_s_per_gpu')} | {gib(s)} | {gib(e)} | {gib(c)} |")
PY
cat "$OUT/llama.md"
