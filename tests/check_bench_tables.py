#!/usr/bin/env python3
"""bench/scaling_table.py, bench/ab_table.py and their drivers' plumbing on records whose answer is known
(python3 stdlib only; ctest's bench_tables test runs it from the source tree).

1. Repeated runs: each (shape, side, GPUs) group's median, range and ok runs; efficiency, the ratio to FSDP2
   eager and the points between them from the medians; one table row a group, with its largest peak memory.
2. One run each: the figures of the runs themselves, and the table without the runs column.
3. bench/scaling.sh --dry-run --repeat 2: every (GPU count, side) twice, tagged with its repeat, in folders of
   their own.
4. ab_table.py: each variant's median, range and runs per GPU count, B/A of the medians, whether the ranges
   overlap, a failed run listed.
5. bench/ab_compare.sh --dry-run --repeat 2: A first in round 1 and B first in round 2, each variant's deck
   overrides and NCCL variable on its own runs only.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import ab_table  # noqa: E402
import scaling_table as st  # noqa: E402

failures = []


def check(name, cond):
    if not cond:
        failures.append(name)


def near(name, got, want, tol=1e-9):
    if got is None or abs(got - want) > tol:
        failures.append(f"{name}: got {got}, want {want}")


def rec(side, gpus, tps, repeat, peak=10 << 30, status="ok"):
    r = {"label": "s", "shape": "s", "mode": "scaling", "side": side, "gpus": gpus, "status": status,
         "repeat": repeat, "strategy": "FULL_SHARD"}
    if status == "ok":
        r["tokens_per_s_per_gpu"], r["peak_memory_bytes"] = float(tps), peak
    return r


def finish(recs):
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "scaling.jsonl")
        with open(src, "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
        st.main(["finish", "--title", "t", src, os.path.join(d, "scaling.md")])
        out = st.load(src)
        with open(os.path.join(d, "scaling.md")) as f:
            return out, f.read()


# ---- 1. repeats ---------------------------------------------------------------------------------
recs = [rec("shardlm", 1, 100, 1), rec("eager", 1, 50, 1), rec("shardlm", 2, 95, 1, peak=12 << 30), rec("eager", 2, 45, 1),
        rec("shardlm", 1, 130, 2), rec("eager", 1, 52, 2), rec("shardlm", 2, 0, 2, status="failed (rc 1)"),
        rec("eager", 2, 47, 2), rec("eager", 2, 70, 3),
        rec("shardlm", 1, 90, 3), rec("shardlm", 2, 99, 3)]
out, md = finish(recs)
by = {(r["side"], r["gpus"], r["repeat"]): r for r in out}
s2 = by[("shardlm", 2, 1)]
check("runs counts the ok repeats", s2["runs"] == 2 and by[("shardlm", 1, 2)]["runs"] == 3)
near("median of the group", s2["median_tokens_per_s_per_gpu"], 97.0)
check("range of the group", s2["min_tokens_per_s_per_gpu"] == 95 and s2["max_tokens_per_s_per_gpu"] == 99)
near("efficiency from the medians", s2["efficiency"], 97.0 / 100.0)
near("eager's efficiency", by[("eager", 2, 2)]["efficiency"], 47.0 / 51.0)
near("vs eager from the medians", s2["vs_eager"], 97.0 / 47.0)
near("points", s2["efficiency_vs_eager_points"], 100.0 * (0.97 - 47.0 / 51.0))
check("a failed repeat gets no figures", "efficiency" not in by[("shardlm", 2, 2)])
rows = [l for l in md.splitlines() if l.startswith("| s | 2 | FULL_SHARD | shardlm |")]
check(f"one row a group: {rows}", len(rows) == 1)
check(f"the row's median, largest peak and runs: {rows}",
      rows and "| 97 |" in rows[0] and "| 12.00 |" in rows[0] and "2: 95-99 |" in rows[0])
check("the runs column", "runs |" in md.splitlines()[4])
check("the failed run listed with its repeat", "- s, 2 GPU(s), shardlm, run 2: failed (rc 1)" in md)

# ---- 2. one run each ----------------------------------------------------------------------------
out, md = finish([rec("shardlm", 1, 100, 1), rec("shardlm", 2, 96, 1), rec("eager", 1, 50, 1), rec("eager", 2, 40, 1)])
by = {(r["side"], r["gpus"]): r for r in out}
near("single efficiency", by[("shardlm", 2)]["efficiency"], 0.96)
near("single vs eager", by[("shardlm", 2)]["vs_eager"], 96.0 / 40.0)
check("no runs column with one run each", "runs |" not in md)
check("single row", "| s | 2 | FULL_SHARD | shardlm | 96 | 96.0% | +16.0 | 10.00 | 2.40x |" in md)

# ---- 3. scaling.sh --dry-run --repeat 2 -----------------------------------------------------------
with tempfile.TemporaryDirectory() as d:
    p = subprocess.run(["bash", os.path.join(ROOT, "bench", "scaling.sh"), "--dry-run", "--gpus", "1,2", "--repeat", "2",
                        "--shapes", "bloom", "--steps", "4", "--warmup", "1", "--keep-runs", "-", d],
                       capture_output=True, text=True, timeout=240)
    check(f"scaling.sh --dry-run exits 0: {p.stdout[-500:]} {p.stderr[-500:]}", p.returncode == 0)
    got = sorted((r["gpus"], r["side"], r["repeat"]) for r in st.load(os.path.join(d, "scaling.jsonl")))
    want = sorted((g, s, k) for g in (1, 2) for s in ("shardlm", "eager") for k in (1, 2))
    check(f"every run twice, tagged: {got}", got == want)
    check("the second runs' folders", all(os.path.isdir(os.path.join(d, "runs", f"bloom-g{g}-r2")) for g in (1, 2)))
    p = subprocess.run(["bash", os.path.join(ROOT, "bench", "scaling.sh"), "--dry-run", "--gpus", "1", "--repeat", "0",
                        "-", d], capture_output=True, text=True, timeout=60)
    check("--repeat 0 refused", p.returncode == 2 and "--repeat wants 1 or more" in p.stderr)
    # The held-out shapes by name: their decks, layers, lengths and micro-batches in the commands; a wrong name
    # refused with the list.
    p = subprocess.run(["bash", os.path.join(ROOT, "bench", "scaling.sh"), "--dry-run", "--gpus", "1", "--shapes",
                        "llama3b,llama8b8k", "--steps", "4", "--warmup", "1", "--keep-runs", "-", d],
                       capture_output=True, text=True, timeout=120)
    check(f"held-out shapes' dry run exits 0: {p.stderr[-300:]}", p.returncode == 0)
    check("the 3B row", "input/bench/llama32-3b.ini --data.train_file=" in p.stdout and "--model.num_layers=28 "
          "--data.max_length=2048 --train.micro_batch_size=4" in p.stdout)
    check("the 8192-token row", "--model.num_layers=8 --data.max_length=8192 --train.micro_batch_size=1" in p.stdout)
    p = subprocess.run(["bash", os.path.join(ROOT, "bench", "scaling.sh"), "--dry-run", "--gpus", "1", "--shapes",
                        "llama2b", "-", d], capture_output=True, text=True, timeout=60)
    said = p.stdout + p.stderr  # (the message's stream depends on where the script's log goes)
    check(f"an unknown shape refused with the names: {said[-300:]}",
          p.returncode == 2 and "unknown shape 'llama2b' (llama1b, llama8b, bloom, llama3b, llama8b8k)" in said)

# ---- 4. ab_table ---------------------------------------------------------------------------------
def ab(variant, gpus, tps, rnd, status="ok"):
    r = {"side": "shardlm", "gpus": gpus, "status": status, "variant": variant, "round": rnd,
         "variant_name": {"a": "old", "b": "new"}[variant]}
    if status == "ok":
        r["tokens_per_s_per_gpu"], r["peak_memory_bytes"] = float(tps), (20 + rnd) << 30
    return r


with tempfile.TemporaryDirectory() as d:
    src = os.path.join(d, "ab.jsonl")
    with open(src, "w") as f:
        for r in [ab("a", 2, 100, 1), ab("b", 2, 103, 1), ab("b", 2, 106, 2), ab("a", 2, 104, 2), ab("a", 2, 98, 3),
                  ab("b", 2, 0, 3, status="timeout"), ab("a", 1, 50, 1), ab("b", 1, 60, 1), ab("b", 1, 61, 2),
                  ab("a", 1, 51, 2)]:
            f.write(json.dumps(r) + "\n")
    ab_table.main(["finish", "--title", "t", src, os.path.join(d, "ab.md")])
    out = st.load(src)
    with open(os.path.join(d, "ab.md")) as f:
        md = f.read()
b2 = [r for r in out if r["variant"] == "b" and r["gpus"] == 2 and r["status"] == "ok"][0]
check("B's ok runs", b2["runs"] == 2)
near("B/A of the medians", b2.get("b_over_a"), 104.5 / 100.0)
check(f"2 GPUs row: {md}", "| 2 | 100 (98-104, 3) | 104 (103-106, 2) | 1.0450 | yes | 23.00 | 22.00 |" in md)
check(f"1 GPU row: {md}", "| 1 | 50 (50-51, 2) | 60 (60-61, 2) | 1.1980 | no |" in md)
check("the names in the header", "| GPUs | A: old | B: new |" in md)
check("the failed run listed", "- b, 2 GPU(s), round 3: timeout" in md)

# ---- 5. ab_compare.sh --dry-run ----------------------------------------------------------------------
with tempfile.TemporaryDirectory() as d:
    p = subprocess.run(["bash", os.path.join(ROOT, "bench", "ab_compare.sh"), "--dry-run", "--gpus", "2", "--repeat", "2",
                        "--shape", "bloom", "--steps", "4", "--warmup", "1", "--b-args", "--fsdp.forward_prefetch=false",
                        "--b-env", "NCCL_MAX_CTAS=16", "-", d], capture_output=True, text=True, timeout=240)
    check(f"ab_compare.sh --dry-run exits 0: {p.stdout[-500:]} {p.stderr[-500:]}", p.returncode == 0)
    recs = st.load(os.path.join(d, "ab.jsonl"))
    check(f"A, B, then B, A: {[(r.get('round'), r.get('variant')) for r in recs]}",
          [(r.get("round"), r.get("variant")) for r in recs] == [(1, "a"), (1, "b"), (2, "b"), (2, "a")])
    for r in recs:
        b_run = r.get("variant") == "b"
        cmd = r.get("command", "")
        check(f"{r.get('variant')} round {r.get('round')}: its own overrides: {cmd}",
              ("--fsdp.forward_prefetch=false" in cmd) == b_run and ("-x NCCL_MAX_CTAS" in cmd) == b_run)
    check("ab.md written", os.path.isfile(os.path.join(d, "ab.md")))

if failures:
    print("FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("bench_tables: all checks passed")
