#!/usr/bin/env bash
# llama_compare.sh: shardlm against PyTorch FSDP2 (eager, and with torch.compile) on Llama shapes,
# one GPU, in one command. Each row trains the same shape, sequence length and micro-batch on both
# sides with random weights (bf16 parameters, fp32 reduction and master, AdamW, clipping 1.0) and
# records tokens/s (median over the steps after the warm-up) and peak GPU memory.
#
#   bash bench/llama_compare.sh [--bin build/bin/shardlm] [--steps 10] [--warmup 4] [--gpus 1]
#                               [--sides shardlm,eager,compile] [--timeout 240] [--lora R:ALPHA] ROW... OUT
#
# --gpus G (default 1) runs every row FULL_SHARD on G GPUs of this machine on both sides (shardlm
# under mpirun -np G, FSDP2 under torchrun --nproc-per-node G), MICRO samples per GPU; tokens/s and
# memory are per GPU. The PEFT side is one GPU only.
#
# --lora R:ALPHA trains LoRA adapters (rank R, alpha ALPHA, every linear layer of the blocks, the base
# frozen) on both sides instead: shardlm with [lora], and transformers + PEFT (bench/peft_lora.py:
# bf16 base, fp32 adapters under bf16 autocast, torch AdamW) as the side "peft" (the default sides
# become shardlm,peft).
#
# A ROW is label=DECK:LAYERS:SEQ:MICRO[:ac], e.g. llama8b-2k=input/bench/llama31-8b.ini:4:2048:8
# (the deck gives the shape; LAYERS replaces its layer count so the model fits one GPU; ":ac"
# turns activation checkpointing on for both sides). OUT gets llama.jsonl, llama.md and the logs.
# Run with the shardlm runtime on the paths (source RT/env.sh).
set -uo pipefail
BIN=build/bin/shardlm STEPS=10 WARMUP=4 SIDES="" RUN_TIMEOUT=240 LORA= GPUS=1
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
    -*) echo "llama_compare.sh: unknown option $1" >&2; exit 2 ;;
    *) POS+=("$1") ;;
  esac
  shift
done
[ ${#POS[@]} -ge 2 ] || { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $GPUS =~ ^[1-9][0-9]*$ ]] || { echo "llama_compare.sh: --gpus wants a positive count, not '$GPUS'" >&2; exit 2; }
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
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
JSONL=$OUT/llama.jsonl
: > "$JSONL"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
want() { [[ ",$SIDES," == *",$1,"* ]]; }

# The deck's shape as fsdp2_bloom.py flags.
shape_flags() {
  python3 - "$1" <<'PY'
import configparser, sys
c = configparser.ConfigParser(inline_comment_prefixes=("#",))
c.read(sys.argv[1])
m = c["model"]
print(f"--vocab {m['vocab_size']} --hidden {m['hidden_size']} --heads {m['num_heads']} "
      f"--kv-heads {m.get('num_kv_heads', m['num_heads'])} --intermediate {m['intermediate_size']} "
      f"--rope-theta {float(m['rope_theta'])}")
PY
}

record() {  # label side status seconds log run_dir|-
  python3 - "$@" "$WARMUP" "$GPU" "$GPUS" >> "$JSONL" <<'PY'
import json, os, statistics, sys
label, side, status, seconds, log, run_dir, warmup, gpu, gpus = sys.argv[1:10]
rec = {"label": label, "side": side, "status": status, "seconds": int(seconds), "gpu": gpu, "gpus": int(gpus)}
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
else:
    for line in open(log, errors="replace"):
        if line.startswith('{"impl": "pytorch-fsdp2"') or line.startswith('{"impl": "peft-lora"'):
            o = json.loads(line)
            rec.update(tokens_per_s_per_gpu=o["tokens_per_s_per_gpu"], peak_memory_bytes=o["peak_memory_bytes"],
                       torch=o.get("torch"), compile=o.get("compile"))
if status == "ok" and "tokens_per_s_per_gpu" not in rec: rec["status"] = "no result"
print(json.dumps(rec))
PY
}

for row in "${POS[@]}"; do
  label=${row%%=*}
  IFS=: read -r deck layers seq micro ac <<< "${row#*=}"
  acflag=false; [ "${ac:-}" = ac ] && acflag=true
  data=$OUT/data_${seq}_$((STEPS * micro * GPUS)).jsonl  # enough records for this row's steps
  [ -f "$data" ] || python3 bench/make_bench_data.py --out "$data" --seq "$seq" --records $((STEPS * micro * GPUS)) >/dev/null || exit 1
  echo "== $label: $deck, $layers layers, seq $seq, micro-batch $micro per GPU, $GPUS GPU(s), activation checkpointing $acflag"
  if want shardlm; then
    run=$OUT/run_$label log=$OUT/${label}_shardlm.log t0=$(date +%s)
    timeout "$RUN_TIMEOUT" mpirun -np "$GPUS" --bind-to none "$BIN" train "$deck" --data.train_file="$data" \
      --model.num_layers="$layers" --data.max_length="$seq" --train.micro_batch_size="$micro" \
      --train.batch_size=$((micro * GPUS)) --fsdp.strategy=FULL_SHARD --train.max_steps="$STEPS" --train.log_every=1 \
      --fsdp.activation_checkpointing="$acflag" --run.dir="$run" "${LORA_FLAGS[@]}" > "$log" 2>&1
    rc=$?; st=ok; [ $rc = 0 ] || st="failed (rc $rc)"; [ $rc = 124 ] && st=timeout
    record "$label" shardlm "$st" $(( $(date +%s) - t0 )) "$log" "$run"
    tail -1 "$JSONL"
  fi
  if want peft; then
    log=$OUT/${label}_peft.log t0=$(date +%s) extra=""
    [ "$acflag" = true ] && extra=--activation-checkpointing
    # shellcheck disable=SC2046
    timeout "$RUN_TIMEOUT" python3 bench/peft_lora.py $(shape_flags "$deck") "${PEFT_FLAGS[@]}" --layers "$layers" \
      --seq "$seq" --micro-batch "$micro" --steps "$STEPS" --warmup "$WARMUP" --label "$label" $extra > "$log" 2>&1
    rc=$?; st=ok; [ $rc = 0 ] || st="failed (rc $rc)"; [ $rc = 124 ] && st=timeout
    record "$label" peft "$st" $(( $(date +%s) - t0 )) "$log" -
    tail -1 "$JSONL"
  fi
  for side in eager compile; do
    want $side || continue
    log=$OUT/${label}_$side.log t0=$(date +%s)
    extra=""; [ $side = compile ] && extra=--compile; [ "$acflag" = true ] && extra="$extra --activation-checkpointing"
    # shellcheck disable=SC2046
    timeout "$RUN_TIMEOUT" torchrun --standalone --nproc-per-node "$GPUS" bench/fsdp2_bloom.py --arch llama --strategy FULL_SHARD $(shape_flags "$deck") \
      --layers "$layers" --seq "$seq" --micro-batch "$micro" --steps "$STEPS" --warmup "$WARMUP" \
      --label "$label" $extra > "$log" 2>&1
    rc=$?; st=ok; [ $rc = 0 ] || st="failed (rc $rc)"; [ $rc = 124 ] && st=timeout
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
