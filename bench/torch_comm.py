"""PyTorch's NCCL collectives measured the way `shardlm comm-test --backend=cuda` measures them.

torchrun --nproc-per-node G bench/torch_comm.py [--sizes 1M,16M,256M,1G] [--iters 20] [--warmup 5]

For each size (bytes, fp32; all-gather: the gathered output; reduce-scatter: the input, as
nccl-tests and shardlm count them) it times each op per iteration with CUDA events, takes each
rank's median, then the largest over the ranks, and prints one JSON line per (op, size) on rank 0
with time_us, algbw and busbw in GB/s (10^9 bytes; busbw factors: all-reduce 2(n-1)/n, all-gather
and reduce-scatter (n-1)/n, broadcast 1).
"""
import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1M,16M,256M,1G")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    factors = {"all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_reduce": 2 * (n - 1) / n,
               "broadcast": 1.0}
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        count = size // 4 // n * n  # whole fp32 elements per rank
        full = torch.ones(count, device="cuda")
        part = torch.ones(count // n, device="cuda")
        ops = {
            "all_gather": lambda: dist.all_gather_into_tensor(full, part),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full),
            "all_reduce": lambda: dist.all_reduce(full),
            "broadcast": lambda: dist.broadcast(full, 0),
        }
        for name, op in ops.items():
            for _ in range(args.warmup):
                op()
            times = []
            for _ in range(args.iters):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                op()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1000.0)
            t = torch.tensor([statistics.median(times)], device="cuda")
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            us = float(t.item())
            algbw = count * 4 / us / 1e3
            if rank == 0:
                print(json.dumps({"op": name, "bytes": count * 4, "ranks": n, "time_us": round(us, 2),
                                  "algbw": round(algbw, 2), "busbw": round(algbw * factors[name], 2),
                                  "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}),
                      flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
