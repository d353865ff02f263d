#!/usr/bin/env python3
"""A shardlm LoRA adapter loaded through PEFT as users load it, against shardlm's own merge.

    build/bin/shardlm export RUN ADAPTER --adapter
    build/bin/shardlm export RUN MERGED --merge
    python3 bench/check_peft_adapter.py --base BASE_DIR --adapter ADAPTER --merged MERGED [--ids 2,5,9]

Loads BASE_DIR with AutoModelForCausalLM (for a multimodal Gemma 3 folder, Gemma3ForConditionalGeneration
with its vision tower), wraps it with PeftModel.from_pretrained(base, ADAPTER), and checks that every tensor of
adapter_model.safetensors landed in the model (none missing, values equal), which modules PEFT wrapped (none
of a vision tower), and that the wrapped model's logits equal those of MERGED (shardlm's W + scale B A folder)
and differ from the base's (the adapters do something).

Prints one JSON line; exit status 1 if a tensor is missing or differs, a vision module is wrapped, or the
logits disagree beyond --tolerance.
"""
import argparse
import json
import sys

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--merged", required=True)
    ap.add_argument("--ids", default="2,5,9,13,21,34,55,60")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    args = ap.parse_args()

    base = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32)
    base_class = type(base).__name__
    model = PeftModel.from_pretrained(base, args.adapter).eval()

    # The file's names as PEFT saves them have no adapter name; in the model they carry ".default".
    saved = load_file(f"{args.adapter}/adapter_model.safetensors")
    state = model.state_dict()
    missing, worst = [], 0.0
    for name, value in saved.items():
        key = name.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")
        if key == name:  # a module trained whole (modules_to_save): PEFT's copy of it
            module, leaf = name.rsplit(".", 1)
            key = f"{module}.modules_to_save.default.{leaf}"
        if key not in state:
            missing.append(name)
            continue
        worst = max(worst, (state[key].float() - value.float()).abs().max().item())
    wrapped = [n for n, m in model.named_modules() if isinstance(m, LoraLayer)]
    vision = [n for n in wrapped if "vision" in n]

    ids = torch.tensor([[int(t) for t in args.ids.split(",")]])
    with torch.no_grad():
        peft_logits = model(input_ids=ids).logits.float()
        with model.disable_adapter():
            base_logits = model(input_ids=ids).logits.float()
        merged = AutoModelForCausalLM.from_pretrained(args.merged, dtype=torch.float32).eval()
        merged_logits = merged(input_ids=ids).logits.float()
    vs_merged = (peft_logits - merged_logits).abs().max().item()
    vs_base = (peft_logits - base_logits).abs().max().item()
    ok = not missing and worst == 0.0 and not vision and vs_merged <= args.tolerance and vs_base > args.tolerance
    print(json.dumps({"base_class": base_class, "merged_class": type(merged).__name__,
                      "adapter_tensors": len(saved), "missing": missing[:8], "max_tensor_diff": worst,
                      "wrapped_modules": len(wrapped), "wrapped_vision_modules": vision[:8],
                      "logits_vs_merged": vs_merged, "logits_vs_base": vs_base, "ok": ok}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
