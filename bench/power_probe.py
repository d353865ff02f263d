#!/usr/bin/env python3
"""What NCCL traffic beside GEMMs costs them on a power-limited GPU (PyTorch, torchrun, 2+ GPUs of one host).

    torchrun --standalone --nproc-per-node 2 bench/power_probe.py [--seconds 6] [--mib 256] [--comms 8] [--out FILE]

Each rank runs bf16 GEMMs (8192 x 8192 x 8192) back to back on its GPU, in phases of --seconds each:
  gemm          GEMMs alone
  gemm+rs       GEMMs, and beside them (another stream) fp32 reduce-scatters of --mib MiB over all ranks,
                --comms of them queued with every 8 GEMMs
  gemm+ag       GEMMs, and bf16 all-gathers of --mib MiB beside them
  rs            the reduce-scatters alone
while a thread samples the GPU's SM clock and power through NVML every 20 ms. Prints one JSON line a
phase and rank: GEMM TFLOP/s, collective GB/s (bus bandwidth), the median SM clock (MHz) and power (W)
of the phase's middle 80%, and writes them to --out too. If the GEMMs slow more than the clock drops,
the collectives cost them bandwidth or SMs; if the clock drops at the same power, they cost power.
"""
import argparse
import json
import os
import statistics
import threading
import time

import torch
import torch.distributed as dist


def sampler(handle, samples, stop):
    import pynvml
    while not stop.is_set():
        clock = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
        power = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        samples.append((time.time(), clock, power))
        time.sleep(0.02)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--comms", type=int, default=8, help="collectives queued beside every 8 GEMMs")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    import pynvml
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(local)
    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16) * 0.02
    y = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    elems = a.mib * 1024 * 1024 // 4
    elems -= elems % world
    grad = torch.randn(elems, device="cuda", dtype=torch.float32)
    part = torch.empty(elems // world, device="cuda", dtype=torch.float32)
    half = torch.randn(2 * elems // world, device="cuda", dtype=torch.bfloat16)
    gathered = torch.empty(2 * elems, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    samples, stop = [], threading.Event()
    t = threading.Thread(target=sampler, args=(handle, samples, stop), daemon=True)
    t.start()
    records = []
    for phase in ("gemm", "gemm+rs", "gemm+ag", "rs"):
        dist.barrier()
        torch.cuda.synchronize()
        gemms = comms = 0
        begin = time.time()
        while time.time() - begin < a.seconds:
            if phase != "rs":
                for _ in range(8):
                    torch.matmul(x, w, out=y)
                gemms += 8
            if phase != "gemm":
                with torch.cuda.stream(side):
                    for _ in range(a.comms):
                        if phase in ("gemm+rs", "rs"):
                            dist.reduce_scatter_tensor(part, grad)
                        else:
                            dist.all_gather_into_tensor(gathered, half)
                comms += a.comms
            torch.cuda.synchronize()
        end = time.time()
        span = end - begin
        window = [s for s in samples if begin + 0.1 * span <= s[0] <= end - 0.1 * span]
        comm_bytes = (elems * 4 if phase in ("gemm+rs", "rs") else gathered.numel() * 2) * (world - 1) / world
        rec = {"phase": phase, "rank": rank, "world": world, "gpu": torch.cuda.get_device_name(),
               "seconds": round(span, 2),
               "gemm_tflops": round(gemms * 2 * n ** 3 / span / 1e12, 1),
               "comm_busbw_gbs": round(comms * comm_bytes / span / 1e9, 1),
               "sm_mhz_median": statistics.median(s[1] for s in window) if window else None,
               "power_w_median": round(statistics.median(s[2] for s in window), 1) if window else None,
               "samples": len(window)}
        records.append(rec)
        print(json.dumps(rec), flush=True)
    stop.set()
    if a.out:
        with open(a.out + (f".rank{rank}" if world > 1 else ""), "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
