#!/usr/bin/env python3
"""bench/ab_compare.sh's records and table (stdlib only).

    ab_table.py append --variant V --name NAME --round R --gpus G SRC.jsonl DEST.jsonl
        bench/llama_compare.sh's shardlm record of one run onto DEST, tagged with the variant (a or b), its
        name and the round (a missing SRC becomes one "no records" record, so the table shows the hole)
    ab_table.py finish [--title T] AB.jsonl AB.md
        per GPU count, each variant's median tok/s/GPU over its ok runs, their range and number, and B/A of
        the medians; whether the two ranges overlap (if they do, the difference is within what the runs
        spread); peak memory, the largest run's. Adds to every record its group's `runs` and `median_`,
        `min_` and `max_tokens_per_s_per_gpu`, and `b_over_a` to B's; rewrites AB.jsonl, writes AB.md.
"""
import json
import sys

from scaling_table import GIB, append_tagged, cli, group_stats, load, ok


def append(a):
    return append_tagged(a.src, a.dest, {"variant": a.variant, "variant_name": a.name, "round": a.round},
                         {"side": "shardlm", "gpus": a.gpus}, side="shardlm")


def summarise(recs):
    """(variant, GPUs) -> scaling_table.group_stats' figures; B's records also get `b_over_a`."""
    stats = group_stats(recs, lambda r: (r.get("variant"), r.get("gpus")))
    for r in recs:
        a, b = stats.get(("a", r.get("gpus")), {}), stats[(r.get("variant"), r.get("gpus"))]
        if r.get("variant") == "b" and b["runs"] and a.get("runs"):
            r["b_over_a"] = b["median"] / a["median"]
    return stats


def name_of(recs, variant):
    for r in recs:
        if r.get("variant") == variant and r.get("variant_name"):
            return r["variant_name"]
    return variant


def cell(s):
    if not s.get("runs"):
        return "-"
    return f"{s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f}, {s['runs']})"


def table(recs, stats, title):
    a_name, b_name = name_of(recs, "a"), name_of(recs, "b")
    out = [f"## {title}" if title else "## A/B", "",
           f"A = {a_name}, B = {b_name}: tok/s a GPU, the median of each variant's ok runs (their range, their "
           "number); B/A of the medians; overlap: whether the two ranges overlap (then the difference is within "
           "the runs' spread).", "",
           f"| GPUs | A: {a_name} | B: {b_name} | B/A | overlap | A peak GiB | B peak GiB |",
           "| ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for g in sorted({r.get("gpus") for r in recs if r.get("gpus")}):
        a, b = stats.get(("a", g), {}), stats.get(("b", g), {})
        both = a.get("runs") and b.get("runs")
        ratio = f"{b['median'] / a['median']:.4f}" if both else "-"
        overlap = ("yes" if a["min"] <= b["max"] and b["min"] <= a["max"] else "no") if both else "-"
        gib = lambda s: f"{s['peak'] / GIB:.2f}" if s.get("peak") else "-"  # noqa: E731
        out.append(f"| {g} | {cell(a)} | {cell(b)} | {ratio} | {overlap} | {gib(a)} | {gib(b)} |")
    bad = [r for r in recs if r.get("status") not in ("ok", "dry run")]
    if bad:
        out += ["", "Runs that did not come out ok:", ""]
        for r in bad:
            out.append(f"- {r.get('variant')}, {r.get('gpus')} GPU(s), round {r.get('round')}: {r.get('status')}"
                       + (f" ({r['error'][:300]})" if r.get("error") else ""))
    return "\n".join(out) + "\n"


def finish(a):
    recs = load(a.jsonl)
    stats = summarise(recs)
    with open(a.jsonl, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    with open(a.md, "w") as f:
        f.write(table(recs, stats, a.title))
    return 0


def append_args(p):
    p.add_argument("--variant", choices=["a", "b"], required=True)
    p.add_argument("--name", default="")
    p.add_argument("--round", type=int, default=1)
    p.add_argument("--gpus", type=int, default=0)


def main(argv=None):
    return cli(argv, __doc__, append_args, append, finish)


if __name__ == "__main__":
    sys.exit(main())
