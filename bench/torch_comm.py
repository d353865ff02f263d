"""PyTorch's NCCL collectives measured the way `shardlm comm-test --backend=cuda` measures them.

torchrun --nproc-per-node G bench/torch_comm.py [--sizes 1M,16M,256M,1G] [--iters 20] [--warmup 5]
                                                [--ranks-per-node K --groups world,intra,inter]

For each size (bytes, fp32; all-gather: the gathered output; reduce-scatter: the input, as
nccl-tests and shardlm count them) it times each op per iteration with CUDA events, takes each
rank's median, then the largest over the ranks, and prints one JSON line per (op, size) on rank 0
with time_us, algbw and busbw in GB/s (10^9 bytes; busbw factors: all-reduce 2(n-1)/n, all-gather
and reduce-scatter (n-1)/n, broadcast 1; n the group's size).

With --ranks-per-node K the ranks form emulated nodes of K consecutive ranks, as shardlm's
`--dist.ranks_per_node` does, and --groups measures HYBRID_SHARD's groups as `shardlm comm-test`
does: "intra" = the K ranks of one node (the shard group), "inter" = the ranks with the same place
in their node (the replicate group); all groups of one kind run at the same time.
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
    ap.add_argument("--ranks-per-node", type=int, default=0,
                    help="emulated nodes of K consecutive ranks (0: one node of all ranks)")
    ap.add_argument("--groups", default="world", help="comma-separated subset of world,intra,inter")
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    k = args.ranks_per_node or world
    if world % k != 0:
        raise SystemExit(f"torch_comm.py: --ranks-per-node {k} does not divide {world} ranks")
    for kind in args.groups.split(","):
        if kind == "world":
            group, members = None, list(range(world))
        elif kind in ("intra", "inter"):
            if kind == "intra":
                sets = [list(range(node * k, node * k + k)) for node in range(world // k)]
            else:
                sets = [list(range(local, world, k)) for local in range(k)]
            group = members = None
            for ranks in sets:  # every rank takes part in making every group
                g = dist.new_group(ranks)
                if rank in ranks:
                    group, members = g, ranks
        else:
            raise SystemExit(f"torch_comm.py: unknown group kind {kind!r} (world, intra, inter)")
        if len(members) < 2:
            if rank == 0:
                print(f"# {kind}: groups of one rank, nothing to measure", flush=True)
            continue
        measure(args, kind, group, members, rank)
    dist.destroy_process_group()


def measure(args, kind, group, members, rank) -> None:
    n = len(members)
    root = members[0]
    factors = {"all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_reduce": 2 * (n - 1) / n,
               "broadcast": 1.0}
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        count = size // 4 // n * n  # whole fp32 elements per rank
        full = torch.ones(count, device="cuda")
        part = torch.ones(count // n, device="cuda")
        ops = {
            "all_gather": lambda: dist.all_gather_into_tensor(full, part, group=group),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full, group=group),
            "all_reduce": lambda: dist.all_reduce(full, group=group),
            "broadcast": lambda: dist.broadcast(full, root, group=group),
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
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # over every rank: all groups of the kind
            us = float(t.item())
            algbw = count * 4 / us / 1e3
            if rank == 0:
                print(json.dumps({"op": name, "group": kind, "bytes": count * 4, "ranks": n, "time_us": round(us, 2),
                                  "algbw": round(algbw, 2), "busbw": round(algbw * factors[name], 2),
                                  "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}),
                      flush=True)


if __name__ == "__main__":
    main()
