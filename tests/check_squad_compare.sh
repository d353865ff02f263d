#!/usr/bin/env bash
# bench/squad_compare.sh's plumbing on the CPU backend (a tiny model, 8 / 4 questions, 1 epoch): the
# 1-rank and 2-rank FULL_SHARD runs twice each with --repeat 2, interleaved; every run leaves its folder
# and its record, the table gives each run's median with the spread of its two runs, and the ratio line
# of the 2-rank run against the 1-rank one is taken on those medians.
#   bash tests/check_squad_compare.sh SHARDLM_BINARY SCRATCH_DIR
set -u
BIN=$1 OUT=$2/squad_compare
fail() { echo "check_squad_compare: $*" >&2; exit 1; }
rm -rf "$OUT"
cd "$(dirname "$0")/.." || exit 1
bash bench/squad_compare.sh --backend cpu --quick --bin "$BIN" --gpus 2 --only fsdp1,full --repeat 2 --skip-hf \
  --questions 8,4 --timeout 120 --budget 240 - "$OUT" > "$OUT.log" 2>&1 || { tail -20 "$OUT.log"; fail "the script failed"; }
for d in fsdp-1gpu fsdp-1gpu-r2 full-shard-2gpu full-shard-2gpu-r2; do
  [ -f "$OUT/runs/$d/metrics.jsonl" ] || fail "no run folder $d"
done
python3 - "$OUT" <<'PY' || fail "records or table wrong"
import json, re, statistics, sys
out = sys.argv[1]
recs = [json.loads(l) for l in open(out + "/squad.jsonl")]
assert [(r["config"], r["repeat"]) for r in recs] == [("fsdp1", 1), ("full", 1), ("fsdp1", 2), ("full", 2)], recs
assert all(r["status"] == "ok" for r in recs), [r["status"] for r in recs]
med = {c: statistics.median(r["train_samples_per_second"] for r in recs if r["config"] == c) for c in ("fsdp1", "full")}
table = open(out + "/squad.md").read()
for c, label in (("fsdp1", "1 GPU"), ("full", "2 GPUs")):
    vals = [r["train_samples_per_second"] for r in recs if r["config"] == c]
    want = f"| {med[c]:.2f} ({min(vals):.2f}-{max(vals):.2f}, 2 runs) |"
    row = next(l for l in table.splitlines() if l.startswith(f"| shardlm FULL_SHARD, {label} |"))
    assert want in row, (want, row)
m = re.search(r"FULL_SHARD on 2 GPUs against 1 \(medians\): ([0-9.]+)x samples/s", table)
assert m and abs(float(m.group(1)) - med["full"] / med["fsdp1"]) < 0.006, (m and m.group(1), med)
PY
echo "check_squad_compare: ok"
