#!/usr/bin/env python3
"""transformers + PEFT LoRA baseline for bench/lora_compare.sh: a Llama shape, random weights, one GPU.

    python3 bench/peft_lora.py --layers 32 --seq 2048 --micro-batch 2 [--activation-checkpointing]

What it runs, as a PEFT user fine-tuning an 8B model on one GPU does:
  * LlamaForCausalLM from a LlamaConfig (no download) with random weights, created on the GPU in
    bf16 (the frozen base), SDPA attention;
  * peft.get_peft_model with LoraConfig(r, lora_alpha, lora_dropout 0, target_modules "all-linear"):
    the adapters in fp32 (PEFT's autocast_adapter_dtype), the base frozen;
  * the forward under torch.autocast(bf16); torch.optim.AdamW (fused) on the adapters, weight decay
    0.01, gradient-norm clipping to 1.0;
  * --activation-checkpointing: model.gradient_checkpointing_enable (non-reentrant), as Trainer's
    gradient_checkpointing=True does;
  * random token batches of --micro-batch x --seq, labels = inputs.
Timing: each step between torch.cuda.synchronize() calls; tokens/s = micro_batch x seq / step time,
median over the steps after --warmup. Memory: torch.cuda.max_memory_allocated / reserved, reset after
setup. Prints one JSON line starting with {"impl": "peft-lora", ...}.
"""
import argparse
import json
import statistics
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=14336)
    p.add_argument("--rope-theta", type=float, default=500000.0)
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--label", default="")
    a = p.parse_args()

    import peft
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    dev = torch.device("cuda", 0)
    torch.manual_seed(42)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                      num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, intermediate_size=a.intermediate,
                      rms_norm_eps=1e-5, rope_theta=a.rope_theta, initializer_range=0.02, use_cache=False,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    with torch.device(dev):
        base = LlamaForCausalLM._from_config(cfg, torch_dtype=torch.bfloat16)
    if a.activation_checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        base.enable_input_require_grads()
    model = get_peft_model(base, LoraConfig(r=a.r, lora_alpha=a.alpha, lora_dropout=0.0,
                                            target_modules="all-linear", task_type="CAUSAL_LM"))
    model.train()
    trainable = [q for q in model.parameters() if q.requires_grad]
    n_train = sum(q.numel() for q in trainable)
    adapter_dtype = str(trainable[0].dtype)
    opt = torch.optim.AdamW(trainable, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, fused=True)
    gen = torch.Generator(device=dev).manual_seed(7)

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(dev)
    times, losses = [], []
    for _ in range(a.steps):
        x = torch.randint(0, a.vocab, (a.micro_batch, a.seq), device=dev, generator=gen)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0, foreach=True)
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    med = statistics.median(times[a.warmup:])
    print(json.dumps({"impl": "peft-lora", "label": a.label, "layers": a.layers, "seq": a.seq,
                      "micro_batch": a.micro_batch, "activation_checkpointing": a.activation_checkpointing,
                      "tokens_per_s_per_gpu": a.micro_batch * a.seq / med, "step_s_median": med,
                      "peak_memory_bytes": torch.cuda.max_memory_allocated(dev),
                      "peak_reserved_bytes": torch.cuda.max_memory_reserved(dev),
                      "trainable_params": n_train, "adapter_dtype": adapter_dtype, "loss_last": losses[-1],
                      "torch": torch.__version__, "transformers": transformers.__version__,
                      "peft": peft.__version__, "gpu": torch.cuda.get_device_name(dev)}), flush=True)


if __name__ == "__main__":
    main()
