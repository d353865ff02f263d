#!/usr/bin/env bash
# Attention alone on one GPU: shardlm's paths (bench_attention: cuDNN fused, native) beside PyTorch's
# scaled_dot_product_attention with its cuDNN and flash backends, in one command, on the same shapes
# and layout. Writes OUT/attention.jsonl and OUT/attention.md (medians, TFLOP/s, ratios).
#
#   bench/attention_compare.sh [--bin build/bin/bench_attention] [--T 512,...,32768] [--reps 15]
#                              [--tokens 32768] OUT
# Each call holds --tokens tokens: batch = max(1, tokens / T) sequences of length T.
set -u
bin=build/bin/bench_attention
Ts=512,1024,2048,4096,8192,16384,32768
reps=15
tokens=32768
while [ $# -gt 1 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --T) Ts=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    *) echo "attention_compare.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
out=${1:?usage: attention_compare.sh [options] OUT}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
jsonl=$out/attention.jsonl
: > "$jsonl"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt" 2>/dev/null
# label heads kv_heads head_dim extra
shapes=("GQA 32/8 d128|32|8|128|" "MHA 32/32 d128|32|32|128|" "GQA 32/8 d64|32|8|64|" "MHA 32/32 d64|32|32|64|"
        "BLOOM ALiBi 16 d64|16|16|64|--alibi")
for s in "${shapes[@]}"; do
  IFS='|' read -r label H KV D extra <<< "$s"
  echo "== $label" >&2
  "$bin" --T "$Ts" --heads "$H" --kv-heads "$KV" --head-dim "$D" --reps "$reps" --warmup 3 --tokens "$tokens" $extra \
    | sed "s|^{|{\"shape\": \"$label\", |" >> "$jsonl"
  python3 "$here/sdpa_torch.py" --T "$Ts" --heads "$H" --kv-heads "$KV" --head-dim "$D" --reps "$reps" --warmup 3 --tokens "$tokens" \
    --backends cudnn,flash $extra | sed "s|^{|{\"shape\": \"$label\", |" >> "$jsonl"
done
python3 - "$jsonl" > "$out/attention.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    by.setdefault((r["shape"], r["T"]), {})[r["impl"]] = r
impls = ["shardlm-cudnn", "shardlm-native", "torch-sdpa-cudnn", "torch-sdpa-flash"]
print("Causal attention, forward + backward TFLOP/s (forward in parentheses), medians; flash-attention's FLOP count.\n")
print("| shape | T | " + " | ".join(impls) + " | shardlm-cudnn / torch cuDNN |")
print("| --- | ---: | " + " | ".join("---:" for _ in impls) + " | ---: |")
for (shape, T), g in by.items():
    cells = []
    for i in impls:
        r = g.get(i)
        if not r:
            cells.append("")
        elif r["fwdbwd_tflops"] == 0:
            cells.append("n/a")
        else:
            cells.append(f"{r['fwdbwd_tflops']:.0f} ({r['fwd_tflops']:.0f})")
    a, b = g.get("shardlm-cudnn"), g.get("torch-sdpa-cudnn")
    ratio = f"{a['fwdbwd_tflops'] / b['fwdbwd_tflops']:.2f}x" if a and b and b["fwdbwd_tflops"] and a["fwdbwd_tflops"] else ""
    print(f"| {shape} | {T} | " + " | ".join(cells) + f" | {ratio} |")
notes = sorted({(r["impl"], r["note"]) for r in rows if r.get("note")})
if notes:
    print("\nNot run:\n")
    for impl, note in notes:
        print(f"- {impl}: {note}")
PY
cat "$out/attention.md"
