#!/usr/bin/env python3
"""PyTorch FSDP2 baseline for shardlm's benchmark: BLOOM, random init, same shape and batch.

Run under torchrun, one process per GPU:

    torchrun --standalone --nproc-per-node 4 bench/fsdp2_bloom.py --strategy FULL_SHARD

What it does, to match shardlm's CUDA backend (input/bench/bloom560m.ini):
  * transformers' BloomForCausalLM built from a BloomConfig (no download), randomly initialised
    on the GPU, fp32 parameters (the master copy);
  * FSDP2: fully_shard on every BloomBlock, then on the root (embeddings, their LayerNorm, the
    final LayerNorm and the tied LM head), with MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=fp32): bf16 gathered parameters and compute, fp32 gradient reduction;
  * strategies:
      FULL_SHARD     1-D mesh of all GPUs, blocks resharded after forward;
      SHARD_GRAD_OP  the same mesh, reshard_after_forward=False (kept until backward);
      HYBRID_SHARD   2-D mesh (replicate=NODES, shard=GPUs/NODES), FSDP2's HSDP: sharded inside
                     an emulated node of consecutive ranks, all-reduced across the NODES;
      HYBRID_SHARD_ZERO2  the same mesh, reshard_after_forward=False;
      NO_SHARD       2-D mesh (replicate=GPUs, shard=1): HSDP with shard groups of one, i.e.
                     every rank holds the whole fp32 model and AdamW state and gradients are
                     all-reduced in fp32 (DDP-equivalent; fully_shard rather than DDP so that the
                     mixed-precision policy is the same as in the other rows);
    on one GPU every strategy is a mesh of one (unsharded);
  * torch.optim.AdamW(fused=True), weight decay off for biases and LayerNorms as in shardlm;
    gradient-norm clipping to 1.0 (shardlm clips by default; --max-grad-norm 0 turns it off);
  * --activation-checkpointing wraps each block in checkpoint_wrapper (non-reentrant) before
    fully_shard: only the block input is kept, the block is recomputed in backward;
  * --cpu-offload passes CPUOffloadPolicy() to every fully_shard: the fp32 parameters, their
    gradients and AdamW's state live in host memory (pinned), AdamW (foreach, not fused) runs on
    the CPU, as shardlm's fsdp.cpu_offload does;
  * random token batches of --micro-batch x --seq on each GPU (no padding, no accumulation),
    labels = inputs (transformers shifts them), so each step is micro_batch x seq tokens a GPU.

Timing: each step runs between torch.cuda.synchronize() calls; a step's time is the slowest
rank's (all-reduce MAX, as shardlm's step time is the max over ranks). tokens/s per GPU =
micro_batch x seq / step time; the median is over the steps after --warmup. Memory:
torch.cuda.max_memory_allocated() and max_memory_reserved() per GPU, reset after setup (so the
transient full fp32 copy before sharding is not counted; the AdamW state, allocated in the first
step, is). Rank 0 prints one JSON line starting with {"impl": "pytorch-fsdp2", ...}.

--profile-step K runs step K (1-based, as shardlm's run.trace_step) under torch.profiler (CPU and
CUDA); rank 0 exports the Chrome trace (kept in --profile-dir, else deleted) and the JSON line's
"timeline" is bench/trace_summary.py's summary of it: NCCL kernels as the communication lane, every
other GPU event as compute, the "optimizer" record_function around opt.step() as the optimizer.
--tie-embeddings ties a decoder's LM head to its embedding (Llama-3.2-1B, Qwen3, Gemma 3).
--arch qwen3 / mistral / gemma3 / phi3 builds that family's transformers class with the same shape
flags as llama plus --head-dim, --sliding-window, --sliding-window-pattern, --rope-local-theta and
--query-pre-attn-scalar (bench/llama_compare.sh passes them from the deck).
"""
import argparse
import json
import os
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description="PyTorch FSDP2 BLOOM throughput/memory baseline (torchrun)")
    p.add_argument("--strategy", default="FULL_SHARD",
                   choices=["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2", "NO_SHARD"])
    p.add_argument("--nodes", type=int, default=2, help="HYBRID_SHARD: emulated nodes (replicate dim)")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the median")
    p.add_argument("--vocab", type=int, default=250880)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--arch", default="bloom", choices=["bloom"] + list(DECODERS),
                   help="bloom, or a Llama-style family built by its transformers class")
    p.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (0 = --heads)")
    p.add_argument("--intermediate", type=int, default=0, help="llama: SwiGLU width (0 = 4 x hidden)")
    p.add_argument("--rope-theta", type=float, default=10000.0, help="llama: rotary base")
    p.add_argument("--head-dim", type=int, default=0, help="qwen3, mistral, gemma3: head size (0 = hidden / heads)")
    p.add_argument("--sliding-window", type=int, default=0, help="mistral, phi3, gemma3: attention window (0 = none)")
    p.add_argument("--sliding-window-pattern", type=int, default=0,
                   help="gemma3: every N-th layer global, the rest local (windowed)")
    p.add_argument("--rope-local-theta", type=float, default=0.0, help="gemma3: the local layers' rotary base")
    p.add_argument("--query-pre-attn-scalar", type=float, default=0.0, help="gemma3: scores scaled by its 1/sqrt")
    p.add_argument("--rms-eps", type=float, default=1e-5)
    p.add_argument("--tie-embeddings", action="store_true",
                   help="llama: the LM head is the embedding (Llama-3.2-1B); default untied")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--cpu-offload", action="store_true", help="FSDP2's CPUOffloadPolicy (AdamW on the host)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each decoder block before fully_shard (as torchtitan does)")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="0 = no clipping")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--label", default="", help="copied into the JSON line")
    p.add_argument("--profile-step", type=int, default=0,
                   help="record step K (1-based, as shardlm's run.trace_step) with torch.profiler and "
                        "summarise it (bench/trace_summary.py) into the JSON line's 'timeline'; 0 = off")
    p.add_argument("--profile-dir", default="",
                   help="with --profile-step: write rank 0's Chrome trace here (profile_stepK_rank0.json)")
    a = p.parse_args()
    if a.steps <= a.warmup:
        p.error("--steps must be larger than --warmup")
    if not 0 <= a.profile_step <= a.steps:
        p.error("--profile-step must be between 0 (off) and --steps")
    return a


# The Llama-style families: their transformers config and model classes.
DECODERS = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
            "mistral": ("MistralConfig", "MistralForCausalLM"), "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
            "phi3": ("Phi3Config", "Phi3ForCausalLM")}


def build_decoder(a):
    """The --arch family's model from its transformers config (random init, no download), SDPA attention."""
    import transformers
    config_class, model_class = (getattr(transformers, n) for n in DECODERS[a.arch])
    kw = dict(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
              num_key_value_heads=a.kv_heads or a.heads, intermediate_size=a.intermediate or 4 * a.hidden,
              rms_norm_eps=a.rms_eps, rope_theta=a.rope_theta, initializer_range=0.02, use_cache=False,
              tie_word_embeddings=a.tie_embeddings, attn_implementation="sdpa")
    if a.head_dim:
        kw["head_dim"] = a.head_dim
    if a.arch in ("mistral", "phi3", "gemma3"):
        kw["sliding_window"] = a.sliding_window or None
    if a.arch == "qwen3":
        kw.update(attention_bias=False, use_sliding_window=False)
    if a.arch == "phi3":
        kw.update(resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, pad_token_id=0)
    if a.arch == "gemma3":
        n = a.sliding_window_pattern
        kw.update(layer_types=["full_attention" if n and (i + 1) % n == 0 else "sliding_attention"
                               for i in range(a.layers)],
                  rope_local_base_freq=a.rope_local_theta or a.rope_theta,
                  query_pre_attn_scalar=int(a.query_pre_attn_scalar or a.head_dim or a.hidden // a.heads),
                  hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None, attn_logit_softcapping=None,
                  pad_token_id=0)
    cfg = config_class(**kw)
    return model_class(cfg)


def main():
    a = parse_args()
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    try:  # public since PyTorch 2.6
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    except ImportError:  # older: the composable API
        from torch.distributed._composable.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    import transformers
    from transformers import BloomConfig, BloomForCausalLM

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", local_rank)

    # ---- mesh per strategy ----------------------------------------------------------------
    strategy = a.strategy
    if world == 1:
        mesh = init_device_mesh("cuda", (1,), mesh_dim_names=("shard",))
        layout = "1 GPU, mesh of one (unsharded)"
    elif strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):
        mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("shard",))
        layout = f"1-D mesh ({world},)"
    elif strategy in ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2"):
        if a.nodes < 1 or world % a.nodes:
            raise SystemExit(f"{strategy}: --nodes {a.nodes} does not divide {world} GPUs")
        mesh = init_device_mesh("cuda", (a.nodes, world // a.nodes), mesh_dim_names=("replicate", "shard"))
        layout = f"HSDP mesh (replicate={a.nodes}, shard={world // a.nodes})"
    else:  # NO_SHARD
        mesh = init_device_mesh("cuda", (world, 1), mesh_dim_names=("replicate", "shard"))
        layout = f"HSDP mesh (replicate={world}, shard=1): replicated, fp32 all-reduce"
    reshard = strategy in ("FULL_SHARD", "HYBRID_SHARD") and world > 1

    # ---- model: random init on the GPU, fp32 master ---------------------------------------
    torch.manual_seed(a.seed)
    if a.arch in DECODERS:
        with torch.device(dev):
            model = build_decoder(a)
    else:
        cfg = BloomConfig(vocab_size=a.vocab, hidden_size=a.hidden, n_layer=a.layers, n_head=a.heads,
                          layer_norm_epsilon=1e-5, initializer_range=0.02, hidden_dropout=0.0,
                          attention_dropout=0.0, use_cache=False, tie_word_embeddings=True)
        with torch.device(dev):
            model = BloomForCausalLM(cfg)
    model = model.float().train()
    n_params = sum(p.numel() for p in model.parameters())

    blocks = model.transformer.h if a.arch == "bloom" else model.model.layers
    if a.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl, checkpoint_wrapper)
        for i in range(len(blocks)):
            blocks[i] = checkpoint_wrapper(blocks[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                           preserve_rng_state=False)

    if a.compile:
        for i in range(len(blocks)):
            blocks[i] = torch.compile(blocks[i])

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    offload = {"offload_policy": CPUOffloadPolicy()} if a.cpu_offload else {}
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, **offload)
    # The root (embeddings + tied LM head) is used again at once by backward: never resharded.
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mp, **offload)

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.999), eps=1e-8,
                            **({"foreach": True} if a.cpu_offload else {"fused": True}))

    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed * 1000 + rank)

    def batch():
        return torch.randint(0, a.vocab, (a.micro_batch, a.seq), device=dev, generator=gen)

    clip = a.max_grad_norm > 0
    clip_note = "clip_grad_norm_" if clip else "off"

    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.reset_peak_memory_stats(dev)
    times, losses = [], []
    profiled = None
    for step in range(a.steps):
        x = batch()
        torch.cuda.synchronize()
        # --profile-step K: step K (1-based) under torch.profiler (CPU and CUDA activity); its
        # time is in the step times as shardlm's traced step is in its own.
        prof = None
        if step + 1 == a.profile_step:
            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            prof.start()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = model(input_ids=x, labels=x, use_cache=False)
        out.loss.backward()
        if clip:
            try:
                with record_function("gradient norm"):
                    torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_grad_norm, foreach=True)
            except Exception as e:  # DTensor corner cases across versions: measure without it
                if rank == 0:
                    print(f"fsdp2_bloom: clip_grad_norm_ failed ({type(e).__name__}: {e}); clipping off",
                          file=sys.stderr, flush=True)
                clip, clip_note = False, f"failed: {type(e).__name__}"
        with record_function("optimizer"):  # bench/trace_summary.py's optimizer region
            opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(out.loss.detach())
        if prof is not None:
            prof.stop()
            profiled = prof  # exported after the loop, so that no timed step waits for the file

    # Each step's time is the slowest rank's.
    t = torch.tensor(times, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    step_times = t.tolist()
    mem = torch.tensor([torch.cuda.max_memory_allocated(dev), torch.cuda.max_memory_reserved(dev)],
                       dtype=torch.float64, device=dev)
    all_mem = [torch.zeros_like(mem) for _ in range(world)]
    dist.all_gather(all_mem, mem)
    loss_vals = torch.stack(losses).float()
    dist.all_reduce(loss_vals, op=dist.ReduceOp.AVG)

    timeline = None
    if rank == 0 and profiled is not None:
        # The profiled step summarised as shardlm's: step_ms from its first GPU event to its last (as
        # shardlm's traced step runs from its origin event on drained streams to the optimizer's end);
        # step_wall_ms the host's time for it, profiler start-up included.
        trace_path = os.path.join(a.profile_dir or ".", f"profile_step{a.profile_step}_rank0.json")
        try:
            if a.profile_dir:
                os.makedirs(a.profile_dir, exist_ok=True)
            profiled.export_chrome_trace(trace_path)
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import trace_summary
            with open(trace_path) as f:
                timeline = trace_summary.summarize(json.load(f))
            timeline["step"] = a.profile_step
            timeline["step_wall_ms"] = times[a.profile_step - 1] * 1e3
            timeline["file"] = trace_path
            print("fsdp2_bloom: " + trace_summary.text(timeline, f"step {a.profile_step} timeline (rank 0)"),
                  flush=True)
        except Exception as e:  # the measurement stands without its timeline
            timeline = {"error": f"{type(e).__name__}: {e}", "file": trace_path}
        if not a.profile_dir and os.path.exists(trace_path):
            os.remove(trace_path)
            timeline.pop("file", None)

    tokens_per_gpu_step = a.micro_batch * a.seq
    measured = step_times[a.warmup:]
    tps = [tokens_per_gpu_step / s for s in measured]
    if rank == 0:
        alloc = [m[0].item() for m in all_mem]
        reserved = [m[1].item() for m in all_mem]
        record = {
            "impl": "pytorch-fsdp2",
            "arch": a.arch,
            "compile": a.compile,
            "label": a.label,
            "strategy": strategy if world > 1 else "NO_SHARD (1 GPU)",
            "layout": layout,
            "gpus": world,
            "gpu_name": torch.cuda.get_device_name(dev),
            "vocab": a.vocab, "hidden": a.hidden, "layers": a.layers, "heads": a.heads,
            "params": n_params,
            "seq": a.seq, "micro_batch": a.micro_batch,
            "steps": a.steps, "warmup": a.warmup,
            "activation_checkpointing": a.activation_checkpointing,
            "cpu_offload": a.cpu_offload,
            "param_dtype": "bf16", "reduce_dtype": "fp32",
            "optimizer": "AdamW(foreach=True, host)" if a.cpu_offload else "AdamW(fused=True)",
            "grad_clip": clip_note,
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "tokens_per_s_per_gpu": statistics.median(tps),
            "tokens_per_s_per_gpu_mean": statistics.fmean(tps),
            "step_time_median_s": statistics.median(measured),
            "step_times_s": [round(s, 6) for s in step_times],
            "peak_memory_bytes": max(alloc),
            "peak_reserved_bytes": max(reserved),
            "peak_memory_bytes_per_gpu": alloc,
            "peak_reserved_bytes_per_gpu": reserved,
            "loss_first": loss_vals[0].item(), "loss_last": loss_vals[-1].item(),
            "tie_embeddings": a.tie_embeddings if a.arch != "bloom" else True,
            "timeline": timeline,
            "torch": torch.__version__, "transformers": transformers.__version__,
        }
        print(json.dumps(record), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
