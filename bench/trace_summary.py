#!/usr/bin/env python3
"""One training step's timeline as compute / exposed communication / optimizer (stdlib only).

    python3 bench/trace_summary.py TRACE.json [--step-ms MS] [--metrics metrics.jsonl] [--label L] [--text]

TRACE.json is either
  * shardlm's step timeline (`--run.trace_step=K` writes RUN_DIR/trace_stepK_rankR.json, src/fsdp/trace.cpp):
    Chrome trace events, one "thread_name" record per lane used ("compute", "comm", with their own
    streams "replicate" and "gather" (counted as communication), and offloaded "down", "up", "host"), one "X" span per unit's forward / backward / all-gather / reduction, the
    gradient norm and "optimizer (AdamW)", times in microseconds from the step's start; or
  * PyTorch's profiler trace (torch.profiler ... export_chrome_trace, Kineto's JSON): GPU events of
    category "kernel", "gpu_memcpy" or "gpu_memset"; kernels whose name holds "nccl" are the
    communication lane, every other GPU event the compute lane; the optimizer is the
    "optimizer" record_function region (bench/fsdp2_bloom.py --profile-step wraps opt.step() in it).

Both are reduced the same way (as shardlm's own summarize_trace does): each lane's spans merged into
disjoint intervals; compute_ms and comm_ms their busy time; overlap_ms their intersection;
exposed_comm_ms = comm_ms - overlap_ms (communication while no compute runs); optimizer_ms the
optimizer's time on the compute lane (shardlm: its span; PyTorch: the union of the GPU events
launched inside the region); compute_ms_no_optimizer = compute_ms - the optimizer part;
idle_ms = step_ms - compute_ms - exposed_comm_ms (neither lane busy: launch gaps, host work,
waits). step_ms: --step-ms if given, else the rank's "trace" record of --metrics (shardlm), else the
span from the first event's start to the last one's end.

Prints one JSON object (with --text also a line for people).
"""
import argparse
import json
import sys

OPTIMIZER_NAMES = ("optimizer",)  # record_function names taken as the optimizer (exact, lower case)


def merged(intervals):
    """Intervals (begin, end) merged into a sorted list of disjoint ones."""
    out = []
    for b, e in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and b <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([b, e])
    return out


def length(ivs):
    return sum(e - b for b, e in ivs)


def overlap(a, b):
    """Length of the intersection of two merged interval lists."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def events_of(doc):
    return doc.get("traceEvents", []) if isinstance(doc, dict) else doc


def is_shardlm(events):
    return any(e.get("ph") == "M" and e.get("name") == "thread_name"
               and e.get("args", {}).get("name") in ("compute", "comm") for e in events)


def span(e):
    ts = float(e["ts"])
    return ts, ts + float(e.get("dur", 0.0))


def shardlm_lanes(events, rank=None):
    """compute, comm and optimizer intervals (microseconds) of one rank's shardlm timeline."""
    lane_of = {}  # (pid, tid) -> lane name
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            lane_of[(e.get("pid"), e.get("tid"))] = e.get("args", {}).get("name")
    compute, comm, opt, every = [], [], [], []
    for e in events:
        if e.get("ph") != "X" or (rank is not None and e.get("pid") != rank):
            continue
        lane = lane_of.get((e.get("pid"), e.get("tid")), {0: "compute", 1: "comm"}.get(e.get("tid")))
        iv = span(e)
        every.append(iv)
        if lane == "compute":
            compute.append(iv)
            if e.get("name", "").lower().startswith("optimizer"):
                opt.append(iv)
        elif lane in ("comm", "replicate", "gather"):  # the replicate group's and the gathers' own streams too
            comm.append(iv)
    return compute, comm, opt, every


GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def torch_lanes(events, device=None):
    """compute, comm and optimizer intervals (microseconds) of a PyTorch profiler (Kineto) trace."""
    compute, comm, opt, every = [], [], [], []
    gpu_ann = []   # the optimizer region as Kineto puts it on the GPU timeline
    cpu_ann = []   # the same region on the CPU side
    launches = {}  # correlation id -> CPU timestamp of the launch
    kernels = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        name = str(e.get("name", ""))
        args = e.get("args") or {}
        if cat in GPU_CATS:
            if device is not None and args.get("device") not in (None, device):
                continue
            iv = span(e)
            kernels.append((iv, args.get("correlation")))
            every.append(iv)
            (comm if "nccl" in name.lower() else compute).append(iv)
        elif cat == "gpu_user_annotation" and name.lower() in OPTIMIZER_NAMES:
            gpu_ann.append(span(e))
        elif cat == "user_annotation" and name.lower() in OPTIMIZER_NAMES:
            cpu_ann.append(span(e))
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            launches[args["correlation"]] = float(e["ts"])
    if gpu_ann:
        # The GPU events inside the annotation's extent, clipped to it.
        ann = merged(gpu_ann)
        for iv, _ in kernels:
            for b, e in ann:
                lo, hi = max(iv[0], b), min(iv[1], e)
                if hi > lo:
                    opt.append((lo, hi))
    elif cpu_ann:
        # The GPU events launched from inside the CPU region.
        for iv, corr in kernels:
            t = launches.get(corr)
            if t is not None and any(b <= t <= e for b, e in cpu_ann):
                opt.append(iv)
    return compute, comm, opt, every


def summarize(doc, step_ms=None, rank=None, device=None):
    events = events_of(doc)
    fmt = "shardlm" if is_shardlm(events) else "torch"
    compute, comm, opt, every = (shardlm_lanes(events, rank) if fmt == "shardlm" else torch_lanes(events, device))
    c, m, o = merged(compute), merged(comm), merged(opt)
    us = 1e-3  # microseconds to milliseconds
    first = min((b for b, _ in every), default=0.0)
    last = max((e for _, e in every), default=0.0)
    r = {"format": fmt, "spans": len(every)}
    if step_ms is None:
        # shardlm's spans count from the step's start (its origin event); PyTorch's from the first GPU event.
        step_ms = (last - (0.0 if fmt == "shardlm" else first)) * us
        r["step_ms_from"] = "trace extent"
    r["step_ms"] = step_ms
    r["compute_ms"] = length(c) * us
    r["comm_ms"] = length(m) * us
    r["overlap_ms"] = overlap(c, m) * us
    r["exposed_comm_ms"] = r["comm_ms"] - r["overlap_ms"]
    r["optimizer_ms"] = length(o) * us
    r["compute_ms_no_optimizer"] = r["compute_ms"] - overlap(c, o) * us
    r["idle_ms"] = max(0.0, step_ms - r["compute_ms"] - r["exposed_comm_ms"])
    return r


def step_ms_from_metrics(path, rank):
    """step_ms of the last "trace" record of `rank` in a shardlm metrics.jsonl (None if none)."""
    found = None
    try:
        with open(path) as f:
            for line in f:
                try:
                    o = json.loads(line)
                except ValueError:
                    continue
                if o.get("type") == "trace" and o.get("rank", 0) == rank:
                    found = o.get("step_ms")
    except OSError:
        return None
    return found


def text(r, label=""):
    head = f"{label}: " if label else ""
    return (f"{head}step {r['step_ms']:.2f} ms: compute {r['compute_ms_no_optimizer']:.2f} + optimizer "
            f"{r['optimizer_ms']:.2f} + exposed comm {r['exposed_comm_ms']:.2f} (of {r['comm_ms']:.2f} busy, "
            f"{r['overlap_ms']:.2f} overlapped) + idle {r['idle_ms']:.2f} [{r['format']}]")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--step-ms", type=float, default=None, help="the step's wall time, if known")
    ap.add_argument("--metrics", default=None, help="shardlm metrics.jsonl: step_ms from its trace record")
    ap.add_argument("--rank", type=int, default=0, help="with --metrics: whose trace record (default 0)")
    ap.add_argument("--label", default="")
    ap.add_argument("--text", action="store_true", help="also print a one-line summary")
    a = ap.parse_args(argv)
    with open(a.trace) as f:
        doc = json.load(f)
    step_ms = a.step_ms
    if step_ms is None and a.metrics:
        step_ms = step_ms_from_metrics(a.metrics, a.rank)
    r = summarize(doc, step_ms)
    if a.label:
        r["label"] = a.label
    print(json.dumps(r))
    if a.text:
        print(text(r, a.label))
    return 0


if __name__ == "__main__":
    sys.exit(main())
