"""PyTorch's scaled_dot_product_attention on one GPU, forward and forward + backward, for
bench/attention_compare.sh: the same shapes, layout and FLOP count as bench_attention.

q, k and v are views of one [B, T, (H + 2 KV) d] projection output (the layout of a Llama block), or
of BLOOM's [B, T, H, 3, d] with an ALiBi bias given as attn_mask. Each backend is forced with
torch.nn.attention.sdpa_kernel; a backend that refuses the shape is reported with its error. One
JSON line per backend and length: median milliseconds and TFLOP/s (flash-attention's convention).
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def alibi_slopes(heads):
    # BLOOM's slopes (transformers' build_alibi_tensor).
    closest = 2 ** math.floor(math.log2(heads))
    base = 2 ** (-(2 ** -(math.log2(closest) - 3)))
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest != heads:
        extra = 2 ** (-(2 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra ** (2 * i + 1) for i in range(min(closest, heads - closest))]
    return torch.tensor(slopes)


def median_ms(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def make_inputs(B, T, H, KV, d, dt, alibi):
    """q, k, v as views of one projection output, and BLOOM's ALiBi mask (None for Llama)."""
    if alibi:
        qkv = torch.randn(B, T, H, 3, d, device="cuda", dtype=dt, requires_grad=True)
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
        pos = torch.arange(T, device="cuda")
        bias = alibi_slopes(H).to("cuda")[:, None, None] * (pos[None, None, :] - pos[None, :, None])
        causal = pos[None, :] <= pos[:, None]
        mask = torch.where(causal, bias, torch.tensor(float("-inf"), device="cuda")).to(dt)[None]
        return qkv, q, k, v, mask
    qkv = torch.randn(B, T, (H + 2 * KV) * d, device="cuda", dtype=dt, requires_grad=True)
    q = qkv[..., : H * d].view(B, T, H, d).transpose(1, 2)
    k = qkv[..., H * d:(H + KV) * d].view(B, T, KV, d).transpose(1, 2)
    v = qkv[..., (H + KV) * d:].view(B, T, KV, d).transpose(1, 2)
    return qkv, q, k, v, None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--T", default="2048")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--tokens", type=int, default=0)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--alibi", action="store_true")
    p.add_argument("--backends", default="cudnn,flash")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    H, d = a.heads, a.head_dim
    KV = H if a.alibi else a.kv_heads
    torch.manual_seed(0)
    for T in [int(t) for t in a.T.split(",")]:
        # --batch sequences, or as many as make --tokens tokens (at least one), or one.
        B = a.batch if a.batch > 0 else (max(1, a.tokens // T) if a.tokens > 0 else 1)
        base = {"T": T, "batch": B, "heads": H, "kv_heads": KV, "head_dim": d, "dtype": a.dtype, "alibi": a.alibi,
                "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
        try:
            qkv, q, k, v, mask = make_inputs(B, T, H, KV, d, dt, a.alibi)
            dout = torch.randn(B, H, T, d, device="cuda", dtype=dt)
        except torch.OutOfMemoryError:
            for name in a.backends.split(","):
                print(json.dumps(dict(base, impl=f"torch-sdpa-{name}", fwd_ms=0, fwdbwd_ms=0, fwd_tflops=0,
                                      fwdbwd_tflops=0, note="out of memory for the inputs (ALiBi's mask is [H, T, T])")),
                      flush=True)
            torch.cuda.empty_cache()
            continue
        fwd_flop = 4.0 * B * H * T * T * d / 2
        for name in a.backends.split(","):
            rec = dict(base, impl=f"torch-sdpa-{name}")
            kw = dict(attn_mask=mask) if mask is not None else dict(is_causal=True, enable_gqa=KV != H)

            def fwd():
                return F.scaled_dot_product_attention(q, k, v, **kw)

            def both():
                out = fwd()
                torch.autograd.grad(out, qkv, dout)

            try:
                with sdpa_kernel([BACKENDS[name]]), torch.no_grad():
                    fwd_ms = median_ms(fwd, a.warmup, a.reps)
                with sdpa_kernel([BACKENDS[name]]):
                    both_ms = median_ms(both, a.warmup, a.reps)
                rec.update(fwd_ms=fwd_ms, fwdbwd_ms=both_ms, fwd_tflops=fwd_flop / fwd_ms / 1e9,
                           fwdbwd_tflops=3.5 * fwd_flop / both_ms / 1e9, note="")
            except Exception as e:  # a backend that does not take the shape, or out of memory
                rec.update(fwd_ms=0, fwdbwd_ms=0, fwd_tflops=0, fwdbwd_tflops=0,
                           note=str(e).splitlines()[0][:160].replace('"', "'"))
            print(json.dumps(rec), flush=True)
            torch.cuda.empty_cache()
        del qkv, q, k, v, mask, dout
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
