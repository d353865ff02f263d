#!/usr/bin/env python3
"""bench/scaling.sh's records and tables (stdlib only).

    scaling_table.py append --shape S --mode M --gpus G [--repeat R] SRC.jsonl DEST.jsonl
        bench/llama_compare.sh's records of one (shape, GPU count) onto DEST, tagged with the shape,
        mode and repeat (a missing SRC becomes one "no records" record, so the table shows the hole)
    scaling_table.py finish [--title T] SCALING.jsonl SCALING.md
        groups the records by (shape, side, GPU count), the repeats of one run, and adds to every record
        its group's `runs` (the ok ones), `median_tokens_per_s_per_gpu` and `min_`/`max_tokens_per_s_per_gpu`;
        `efficiency` (the group's median over the same shape and side's on 1 GPU), `vs_eager` (over FSDP2
        eager's median, same shape and GPUs) and `efficiency_vs_eager_points` (its efficiency minus eager's,
        in percentage points); rewrites SCALING.jsonl, and writes the Markdown tables: throughput (one row
        a group: its median, and with repeats the range and the runs), efficiency and memory (the group's
        largest peak); and each run's step timeline.
"""
import argparse
import json
import os
import statistics
import sys

GIB = float(1 << 30)
SIDE_NAMES = {"shardlm": "shardlm", "eager": "FSDP2 eager", "compile": "FSDP2 compile", "peft": "PEFT"}
SIDE_ORDER = ["shardlm", "eager", "compile", "peft"]


def load(path):
    recs = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        recs.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return recs


def append_tagged(src, dest, tags, hole, side=None):
    """llama_compare.sh's records in src (those of `side` only, when given) onto dest, each updated with `tags`;
    none there: the record `hole` with status "no records" instead, so the table shows it."""
    recs = [r for r in load(src) if side is None or r.get("side") == side]
    if not recs:
        recs = [dict(hole, status="no records", error=f"{src}: missing or empty (llama_compare.sh did not run?)")]
    with open(dest, "a") as out:
        for r in recs:
            r.update(tags)
            out.write(json.dumps(r) + "\n")
    return 0


def append(a):
    return append_tagged(a.src, a.dest, {"shape": a.shape, "mode": a.mode, "repeat": a.repeat},
                         {"label": a.shape, "side": "all", "gpus": a.gpus})


def ok(r):
    return r is not None and r.get("status") == "ok" and r.get("tokens_per_s_per_gpu")


def key(r, side=None, gpus=None):
    return (r.get("shape"), side or r.get("side"), gpus or r.get("gpus"))


def group_stats(recs, keyfn):
    """Groups the records by keyfn(record) (the repeats of one run) and adds to each its group's `runs` (how many
    came out ok) and `median_`, `min_` and `max_tokens_per_s_per_gpu` over them; returns group -> {runs, median,
    min, max, peak} (peak: the largest peak memory of its ok runs; the figures only where runs > 0)."""
    tps, peak = {}, {}
    for r in recs:
        k = keyfn(r)
        tps.setdefault(k, [])
        if ok(r):
            tps[k].append(r["tokens_per_s_per_gpu"])
            peak[k] = max(peak.get(k, 0), r.get("peak_memory_bytes") or 0)
    stats = {}
    for k, v in tps.items():
        stats[k] = {"runs": len(v), "peak": peak.get(k, 0)}
        if v:
            stats[k].update(median=statistics.median(v), min=min(v), max=max(v))
    for r in recs:
        s = stats[keyfn(r)]
        r["runs"] = s["runs"]
        if s["runs"]:
            r["median_tokens_per_s_per_gpu"], r["min_tokens_per_s_per_gpu"] = s["median"], s["min"]
            r["max_tokens_per_s_per_gpu"] = s["max"]
    return stats


def enrich(recs):
    med = {k: s["median"] for k, s in group_stats(recs, key).items() if s["runs"]}
    for r in recs:  # first every efficiency, then the comparisons with eager (of the groups' medians)
        base = med.get(key(r, gpus=1))
        if ok(r) and base:
            r["efficiency"] = med[key(r)] / base
    eff = {key(r): r["efficiency"] for r in recs if "efficiency" in r}
    for r in recs:
        eager = med.get(key(r, side="eager"))
        if not ok(r) or not eager or r.get("side") == "eager":
            continue
        r["vs_eager"] = med[key(r)] / eager
        if "efficiency" in r and key(r, side="eager") in eff:
            r["efficiency_vs_eager_points"] = 100.0 * (r["efficiency"] - eff[key(r, side="eager")])
    return recs


def representatives(recs):
    """One record a group, for the throughput table: its first ok run (carrying the group's figures), with the
    group's largest peak memory; else its first record."""
    stats, rep = group_stats(recs, key), {}
    for r in recs:
        if key(r) not in rep or (ok(r) and not ok(rep[key(r)])):
            rep[key(r)] = r
    out = []
    for k, r in rep.items():
        r = dict(r)
        if stats[k]["peak"]:
            r["peak_memory_bytes"] = stats[k]["peak"]
        out.append(r)
    return out


def layout(r):
    g = r.get("gpus", 1)
    if g == 1:
        return "1 GPU"
    if r.get("nodes"):
        return f"HSDP {r['nodes']} x {r.get('ranks_per_node')}"
    return str(r.get("strategy", "FULL_SHARD"))


def f_tps(r):
    return f"{r.get('median_tokens_per_s_per_gpu', r.get('tokens_per_s_per_gpu')):,.0f}" if ok(r) else r.get("status", "-")


def f_runs(r):
    if not ok(r):
        return "-"
    return f"{r['runs']}: {r['min_tokens_per_s_per_gpu']:,.0f}-{r['max_tokens_per_s_per_gpu']:,.0f}"


def f_pct(v):
    return "-" if v is None else f"{100.0 * v:.1f}%"


def f_pts(v):
    return "-" if v is None else f"{v:+.1f}"


def f_gib(r):
    return f"{r['peak_memory_bytes'] / GIB:.2f}" if ok(r) and r.get("peak_memory_bytes") else "-"


def f_x(v):
    return "-" if v is None else f"{v:.2f}x"


def f_ms(v):
    return "-" if v is None else f"{v:.1f}"


def ordered(recs):
    shapes = []
    for r in recs:
        if r.get("shape") not in shapes:
            shapes.append(r.get("shape"))
    side_rank = {s: i for i, s in enumerate(SIDE_ORDER)}
    return sorted(recs, key=lambda r: (shapes.index(r.get("shape")), r.get("gpus", 0),
                                       side_rank.get(r.get("side"), 99)))


def tables(recs, title):
    repeated = any(r.get("repeat", 1) > 1 for r in recs)
    out = [f"## {title}" if title else "## Scaling", ""]
    if repeated:
        out += ["Each row the median of its repeats (runs: how many came out ok, and their range); efficiency and "
                "the ratios from the medians; peak memory the largest.", ""]
    out += ["| shape | GPUs | layout | side | tok/s/GPU | efficiency | eff. vs eager (points) | peak GiB | tok/s vs eager |"
            + (" runs |" if repeated else ""),
            "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if repeated else "")]
    for r in ordered(representatives(recs)):
        out.append(f"| {r.get('shape')} | {r.get('gpus')} | {layout(r)} | {SIDE_NAMES.get(r.get('side'), r.get('side'))} | "
                   f"{f_tps(r)} | {f_pct(r.get('efficiency'))} | "
                   f"{f_pts(r.get('efficiency_vs_eager_points')) if r.get('side') != 'eager' else ''} | {f_gib(r)} | "
                   f"{f_x(r.get('vs_eager')) if r.get('side') != 'eager' else ''} |"
                   + (f" {f_runs(r)} |" if repeated else ""))
    timed = [r for r in ordered(recs) if isinstance(r.get("timeline"), dict)]
    if timed:
        out += ["", "One step's timeline, rank 0 (bench/trace_summary.py; ms): compute = compute-lane busy time "
                "less the optimizer's; exposed comm = communication while nothing computes (of the "
                "communication busy time); idle = neither busy.", "",
                "| shape | GPUs | side | step | step ms | compute | exposed comm (of busy) | optimizer | idle |",
                "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in timed:
            t = r["timeline"]
            side = SIDE_NAMES.get(r.get("side"), r.get("side"))
            if repeated:
                side += f" (run {r.get('repeat', 1)})"
            if "error" in t:
                out.append(f"| {r.get('shape')} | {r.get('gpus')} | {side} | {t.get('step', '-')} | "
                           f"error: {t['error'][:80]} | | | | |")
                continue
            out.append(f"| {r.get('shape')} | {r.get('gpus')} | {side} | {t.get('step', '-')} | {f_ms(t.get('step_ms'))} | "
                       f"{f_ms(t.get('compute_ms_no_optimizer'))} | {f_ms(t.get('exposed_comm_ms'))} "
                       f"({f_ms(t.get('comm_ms'))}) | {f_ms(t.get('optimizer_ms'))} | {f_ms(t.get('idle_ms'))} |")
    bad = [r for r in ordered(recs) if r.get("status") not in ("ok", "dry run")]
    if bad:
        out += ["", "Runs that did not come out ok:", ""]
        for r in bad:
            out.append(f"- {r.get('shape')}, {r.get('gpus')} GPU(s), {r.get('side')}"
                       + (f", run {r.get('repeat', 1)}" if repeated else "") + f": {r.get('status')}"
                       + (f" ({r['error'][:300]})" if r.get("error") else ""))
    transports = sorted({t for r in recs for t in r.get("nccl_transports", [])})
    if transports:
        out += ["", f"NCCL transports seen in the logs (NCCL_DEBUG=INFO): {', '.join(transports)}."]
    return "\n".join(out) + "\n"


def finish(a):
    recs = enrich(load(a.jsonl))
    with open(a.jsonl, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    with open(a.md, "w") as f:
        f.write(tables(recs, a.title))
    return 0


def cli(argv, doc, add_append_args, append_fn, finish_fn):
    """A records-and-table script's command line (this one's, ab_table.py's): `append [its options] SRC DEST`
    and `finish [--title T] JSONL MD`."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("append")
    add_append_args(p)
    p.add_argument("src")
    p.add_argument("dest")
    p = sub.add_parser("finish")
    p.add_argument("--title", default="")
    p.add_argument("jsonl")
    p.add_argument("md")
    a = ap.parse_args(argv)
    return append_fn(a) if a.cmd == "append" else finish_fn(a)


def append_args(p):
    p.add_argument("--shape", required=True)
    p.add_argument("--mode", default="scaling")
    p.add_argument("--gpus", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1)


def main(argv=None):
    return cli(argv, __doc__, append_args, append, finish)


if __name__ == "__main__":
    sys.exit(main())
