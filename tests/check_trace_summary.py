#!/usr/bin/env python3
"""bench/trace_summary.py against timelines whose answer is known (python3 stdlib only; ctest's
trace_summary test runs it from the source tree).

1. A synthetic shardlm timeline written exactly as src/fsdp/trace.cpp's trace_json writes one
   (nlohmann's dump: keys sorted; lanes as "thread_name" metadata; spans "X" in microseconds).
2. A synthetic PyTorch profiler (Kineto) trace: compute and NCCL kernels on two streams, an
   "optimizer" region on the GPU timeline, and the same without it (found through the launches).
3. If present, the recorded H200 timelines of docs/results/trace_h200x4_2026-11-26/ against the
   "trace" records shardlm itself wrote for them (docs/results/trace_h200x4_2026-11-26.jsonl).
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import trace_summary as ts  # noqa: E402

failures = []


def near(name, got, want, tol=1e-6):
    if abs(got - want) > tol:
        failures.append(f"{name}: got {got}, want {want}")


def shardlm_trace(rank, spans, lanes=("compute", "comm")):
    """spans: (name, lane, begin_ms, end_ms), as StepTrace holds them."""
    ev = [{"args": {"name": lane}, "name": "thread_name", "ph": "M", "pid": rank, "tid": i}
          for i, lane in enumerate(lanes)]
    ev.append({"args": {"name": f"rank {rank}"}, "name": "process_name", "ph": "M", "pid": rank})
    for name, lane, b, e in spans:
        ev.append({"dur": max(0.0, e - b) * 1000.0, "name": name, "ph": "X", "pid": rank,
                   "tid": lanes.index(lane), "ts": b * 1000.0})
    return json.loads(json.dumps({"displayTimeUnit": "ms", "traceEvents": ev}, sort_keys=True))


# ---- 1. shardlm -------------------------------------------------------------------------------
# compute: 1-3, 3-6 (adjacent: one interval 1-6), 8-9 optimizer; comm: 0-2 (1 overlapped),
# 5-7.5 (1 overlapped), 6.5-7 (inside the previous). compute 6, comm 4.5, overlap 2, exposed 2.5.
doc = shardlm_trace(0, [
    ("all-gather unit 0", "comm", 0.0, 2.0),
    ("forward unit 0 (embedding)", "compute", 1.0, 3.0),
    ("forward and backward unit 2", "compute", 3.0, 6.0),
    ("reduce unit 1", "comm", 5.0, 7.5),
    ("reduce unit 0", "comm", 6.5, 7.0),
    ("optimizer (AdamW)", "compute", 8.0, 9.0),
])
r = ts.summarize(doc)
assert r["format"] == "shardlm", r
near("shardlm step (extent)", r["step_ms"], 9.0)
near("shardlm compute", r["compute_ms"], 6.0)
near("shardlm comm", r["comm_ms"], 4.5)
near("shardlm overlap", r["overlap_ms"], 2.0)
near("shardlm exposed", r["exposed_comm_ms"], 2.5)
near("shardlm optimizer", r["optimizer_ms"], 1.0)
near("shardlm compute w/o optimizer", r["compute_ms_no_optimizer"], 5.0)
near("shardlm idle", r["idle_ms"], 9.0 - 6.0 - 2.5)
r = ts.summarize(doc, step_ms=10.0)
near("shardlm idle with step_ms", r["idle_ms"], 10.0 - 6.0 - 2.5)
# Offloaded lanes (down, up, host) are neither compute nor comm.
doc = shardlm_trace(0, [("forward unit 1", "compute", 0.0, 2.0), ("copy down unit 1", "down", 0.0, 5.0),
                        ("update unit 1", "host", 1.0, 4.0)], lanes=("compute", "comm", "down", "up", "host"))
r = ts.summarize(doc)
near("offload compute", r["compute_ms"], 2.0)
near("offload comm", r["comm_ms"], 0.0)

# ---- 2. PyTorch (Kineto) --------------------------------------------------------------------
def kernel(name, stream, b_us, e_us, corr, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": b_us, "dur": e_us - b_us,
            "args": {"device": 0, "stream": stream, "correlation": corr}}


def launch(t_us, corr):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t_us,
            "dur": 1.0, "args": {"correlation": corr}}


# GPU (microseconds): compute 1000-3000, 3500-4000 (memcpy); NCCL 0-1500 (500 overlapped),
# 2500-3800 (500 + 300 overlapped: 800); optimizer kernels 5000-5600, 5700-6000.
# compute 2000 + 500 + 900 = 3400 us; comm 2800; overlap 1300; exposed 1500; optimizer 900.
kin = [
    kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 20, 0, 1500, 1),
    kernel("ampere_bf16_s16816gemm", 7, 1000, 3000, 2),
    kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 20, 2500, 3800, 3),
    kernel("Memcpy DtoD (Device -> Device)", 7, 3500, 4000, 4, cat="gpu_memcpy"),
    kernel("void at::native::(anonymous namespace)::fused_adamw_kernel", 7, 5000, 5600, 5),
    kernel("void at::native::(anonymous namespace)::fused_adamw_kernel", 7, 5700, 6000, 6),
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0, "args": {}},
]
for i, t in enumerate((5, 10, 20, 30, 40, 50)):
    kin.append(launch(t, i + 1))
with_gpu_ann = kin + [{"ph": "X", "cat": "gpu_user_annotation", "name": "optimizer", "pid": 0, "tid": 7,
                       "ts": 4900, "dur": 1200, "args": {}}]
with_cpu_ann = kin + [{"ph": "X", "cat": "user_annotation", "name": "optimizer", "pid": 1, "tid": 1,
                       "ts": 35, "dur": 20, "args": {}}]
for what, events in (("gpu annotation", with_gpu_ann), ("cpu annotation", with_cpu_ann)):
    r = ts.summarize({"traceEvents": events, "schemaVersion": 1}, step_ms=7.0)
    assert r["format"] == "torch", r
    near(f"torch {what} compute", r["compute_ms"], 3.4)
    near(f"torch {what} comm", r["comm_ms"], 2.8)
    near(f"torch {what} overlap", r["overlap_ms"], 1.3)
    near(f"torch {what} exposed", r["exposed_comm_ms"], 1.5)
    near(f"torch {what} optimizer", r["optimizer_ms"], 0.9)
    near(f"torch {what} compute w/o optimizer", r["compute_ms_no_optimizer"], 2.5)
    near(f"torch {what} idle", r["idle_ms"], 7.0 - 3.4 - 1.5)
r = ts.summarize({"traceEvents": kin})
near("torch step (extent)", r["step_ms"], 6.0)
near("torch no optimizer region", r["optimizer_ms"], 0.0)

# ---- 3. recorded timelines against shardlm's own summary -------------------------------------
rec_dir = os.path.join(ROOT, "docs", "results", "trace_h200x4_2026-11-26")
rec_jsonl = rec_dir + ".jsonl"
checked = 0
if os.path.isdir(rec_dir) and os.path.isfile(rec_jsonl):
    want = {}
    for line in open(rec_jsonl):
        o = json.loads(line)
        if o.get("rank") == 0:
            want[o["run"]] = o
    for f in sorted(os.listdir(rec_dir)):
        run = f[: -len("_rank0.json")] if f.endswith("_rank0.json") else None
        if run not in want:
            continue
        with open(os.path.join(rec_dir, f)) as fh:
            r = ts.summarize(json.load(fh), step_ms=want[run]["step_ms"])
        for k in ("compute_ms", "comm_ms", "overlap_ms", "exposed_comm_ms"):
            near(f"{run} {k}", r[k], want[run][k], 1e-6)
        checked += 1

if failures:
    print("check_trace_summary: FAILED\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"check_trace_summary: ok (synthetic shardlm and PyTorch timelines; {checked} recorded timelines)")
