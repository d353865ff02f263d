#!/usr/bin/env bash
# packing_compare.sh: the SQuAD tutorial run (BLOOM-560M's shape, max length 512, micro-batch 1 x
# accumulation 4, bf16, one GPU) with and without sequence packing (data.packing), in one command.
#
#   bash bench/packing_compare.sh [--bin build/bin/shardlm] [--tokenizer JSON] [--epochs E] RT OUT
#
# RT: the folder of ../shared/device/bundle-runtime ("-": mpirun on PATH). The data is synthetic
# SQuAD v1.1 (bench/make_squad_data.py: 250 train, 100 dev questions, seed 42), the weights random.
# Packing only pays where samples are shorter than max_length, so the text is tokenized with a
# real subword tokenizer (--tokenizer: a tokenizer.json; bench_tokenizer_json writes Llama 2's
# from ../shared/data/llama2-tokenizer/tokenizer.model, about 4 characters a token as BLOOM's), not
# the byte tokenizer that makes every synthetic sample 512 tokens. Writes OUT/packing.md: samples/s,
# tokens/s per GPU, peak memory, the padding shares and eval loss of both runs, and their ratio.
set -uo pipefail
BIN=build/bin/shardlm TOK="" EPOCHS=5 BACKEND=cuda
POS=()
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift ;;
    --tokenizer) TOK=$2; shift ;;
    --epochs) EPOCHS=$2; shift ;;
    --backend) BACKEND=$2; shift ;;  # cpu: a plumbing test on a tiny model, not a measurement
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) POS+=("$1") ;;
  esac
  shift
done
[ ${#POS[@]} = 2 ] || { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
RT=${POS[0]} OUT=${POS[1]}
[ -n "$TOK" ] || { echo "packing_compare.sh: --tokenizer JSON is required" >&2; exit 2; }
mkdir -p "$OUT/data" "$OUT/runs" || exit 1
OUT=$(cd "$OUT" && pwd) TOK=$(cd "$(dirname "$TOK")" && pwd)/$(basename "$TOK")
[ "$RT" != - ] && { source "$RT/env.sh" || exit 1; }
export NCCL_NVLS_ENABLE=0
python3 bench/make_squad_data.py --train 250 --dev 100 --seed 42 --out "$OUT/data" || exit 1
if [ "$BACKEND" = cpu ]; then SHAPE="vocab_size = 32000
hidden_size = 64
num_layers = 2
num_heads = 4"; else SHAPE="vocab_size = 250880
hidden_size = 1024
num_layers = 24
num_heads = 16"; fi
cat > "$OUT/squad.ini" <<EOF
# Written by bench/packing_compare.sh: the tutorial's values (input/squad/bloom560m-fsdp-1gpu.ini),
# BLOOM-560M's shape with random weights, synthetic SQuAD, a subword tokenizer.
[model]
arch = bloom
$SHAPE
[data]
format = squad
train_file = data/train-v1.1.json
eval_file = data/dev-v1.1.json
max_length = 512
tokenizer = $TOK
[train]
epochs = $EPOCHS
batch_size = 4
micro_batch_size = 1
lr = 5e-5
weight_decay = 0.01
seed = 42
log_every = 25
[fsdp]
strategy = FULL_SHARD
param_dtype = $( [ "$BACKEND" = cpu ] && echo fp32 || echo bf16 )
[eval]
generate = none
[checkpoint]
at_end = false
[run]
backend = $BACKEND
EOF
MPI="mpirun -np 1 --bind-to none"
[ "$(id -u)" = 0 ] && MPI="$MPI --allow-run-as-root"
for mode in unpacked packed; do
  packing=false; [ $mode = packed ] && packing=true
  echo "== $mode: $MPI $BIN train $OUT/squad.ini --data.packing=$packing --run.dir=$OUT/runs/$mode"
  $MPI "$BIN" train "$OUT/squad.ini" --data.packing=$packing --run.dir="$OUT/runs/$mode" > "$OUT/$mode.log" 2>&1
  echo "exit $?"; grep -E "padding:|attention:|done" "$OUT/$mode.log"
done
python3 - "$OUT" <<'PY' | tee "$OUT/packing.md"
import json, sys, os
out = sys.argv[1]
rows = {}
for mode in ("unpacked", "packed"):
    rec = {"setup": {}, "summary": {}, "eval": [], "eval_s": 0.0}
    for line in open(os.path.join(out, "runs", mode, "metrics.jsonl")):
        o = json.loads(line)
        if o.get("type") in ("setup", "summary"): rec[o["type"]] = o
        elif o.get("type") == "eval":
            rec["eval"].append(o["eval_loss"])
            rec["eval_s"] += o["eval_runtime"]
    s = rec["summary"]
    # Trainer's samples/s spans the evaluations too; the second figure is the training steps' alone.
    rec["train_only"] = s["steps"] * 4 / (s["train_runtime"] - rec["eval_s"])
    rows[mode] = rec
print("| run | train samples/s (with eval) | samples/s (steps only) | tokens/s per GPU | peak memory GiB | padding share | eval loss (last epoch) |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for mode, r in rows.items():
    s, st = r["summary"], r["setup"]
    pad = st.get("packed_padding_share" if mode == "packed" else "padding_share", float("nan"))
    print(f"| {mode} | {s['train_samples_per_second']:.2f} | {r['train_only']:.2f} | {s['tokens_per_second_per_gpu']:.0f} | "
          f"{s['peak_memory_bytes'] / 2**30:.2f} | {100 * pad:.1f}% | {r['eval'][-1]:.4f} |")
u, p = rows["unpacked"], rows["packed"]
print(f"\npacked / unpacked: {p['summary']['train_samples_per_second'] / u['summary']['train_samples_per_second']:.2f}x "
      f"samples/s with eval, {p['train_only'] / u['train_only']:.2f}x steps only; "
      f"eval loss {p['eval'][-1]:.4f} vs {u['eval'][-1]:.4f}")
PY
