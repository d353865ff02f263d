#!/usr/bin/env python3
"""The tutorial's path in Hugging Face transformers: Trainer fine-tunes BLOOM-560M on SQuAD v1.1.

One GPU, no sharding (the tutorial's baseline):

    python3 bench/hf_trainer_squad.py --train DIR/train-v1.1.json --dev DIR/dev-v1.1.json --out hf.jsonl

FSDP through Trainer and accelerate (the tutorial's multi-GPU runs), under torchrun:

    torchrun --standalone --nproc-per-node 4 bench/hf_trainer_squad.py --fsdp --train ... --dev ...

What it does, to match shardlm's SQuAD decks (input/squad/*.ini) run with the byte tokenizer:
  * BloomForCausalLM from a BloomConfig of BLOOM-560M's shape (vocab 250880, hidden 1024, 24
    layers, 16 heads), random init, fp32 weights; nothing is downloaded;
  * shardlm's byte tokenizer and SQuAD layout (src/data/tokenizer.cpp, src/data/squad.cpp):
    ids 0-255 are UTF-8 bytes, 256 BOS, 257 EOS, 258 PAD; a sample is
    [BOS] "Question: {q} Context: {c} Answer:" " {first answer}" [EOS], only the context cut (in
    whole characters) to fit --max-length, the loss on the answer and EOS only (labels -100 elsewhere); every record
    of both files is used (bench/make_squad_data.py writes exactly the subset sizes);
  * Trainer with the tutorial's TrainingArguments: per-device batch 1, gradient accumulation 4,
    lr 5e-5 (linear decay, no warm-up), weight decay 0.01, bf16 (autocast over fp32 weights),
    evaluation (loss only) after every epoch with eval batch 1, no checkpoints, no reporting;
  * --fsdp: fsdp="full_shard auto_wrap" with each BloomBlock one unit (fsdp_config
    transformer_layer_cls_to_wrap), --fsdp-offload adds "offload".

Rank 0 prints one JSON line starting with {"impl": "hf-trainer", ...} (and writes it to --out):
Trainer's own train_runtime, train_samples_per_second, train_steps_per_second and train_loss,
eval_loss per epoch, the peak of torch.cuda.max_memory_allocated() over the run (largest over
ranks), the GPU, the versions. --count-tokens prints the token counts of the two files and stops
(no torch needed): the same counts shardlm's byte tokenizer gives.
"""
import argparse
import json
import os
import sys
import tempfile
import time

BOS, EOS, PAD = 256, 257, 258  # shardlm's ByteTokenizer: after the 256 byte ids
IGNORE = -100  # the label PyTorch's cross-entropy skips


def parse_args():
    p = argparse.ArgumentParser(description="Hugging Face Trainer on SQuAD v1.1 (BLOOM shape, byte tokens)")
    p.add_argument("--train", required=True, help="SQuAD v1.1 JSON training file")
    p.add_argument("--dev", required=True, help="SQuAD v1.1 JSON evaluation file")
    p.add_argument("--epochs", type=float, default=5, help="num_train_epochs (tutorial: 5)")
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=1, help="per_device_train_batch_size")
    p.add_argument("--grad-accum", type=int, default=4, help="gradient_accumulation_steps")
    p.add_argument("--eval-batch", type=int, default=1, help="per_device_eval_batch_size")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--logging-steps", type=int, default=5)
    p.add_argument("--vocab", type=int, default=250880)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--fsdp", action="store_true", help="Trainer's FSDP: full_shard auto_wrap (run under torchrun)")
    p.add_argument("--fsdp-offload", action="store_true", help="with --fsdp: add 'offload'")
    p.add_argument("--fsdp-version", type=int, default=1, choices=[1, 2], help="fsdp_config fsdp_version")
    p.add_argument("--label", default="", help="copied into the JSON line")
    p.add_argument("--out", help="write the JSON line to this file as well")
    p.add_argument("--output-dir", help="Trainer's output_dir (default: a temporary folder, removed)")
    p.add_argument("--count-tokens", action="store_true", help="print the files' token counts as JSON and stop")
    a = p.parse_args()
    if a.fsdp_offload and not a.fsdp:
        p.error("--fsdp-offload needs --fsdp")
    return a


# ---- data: shardlm's byte tokenizer and SQuAD sample layout --------------------------------

def encode(text):
    return list(text.encode("utf-8"))


def read_squad(path):
    """(question, context, first answer) for every data[].paragraphs[].qas[] record, in file order."""
    with open(path, encoding="utf-8") as f:
        root = json.load(f)
    records = []
    for article in root["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                records.append((qa["question"], paragraph["context"], qa["answers"][0]["text"]))
    if not records:
        raise SystemExit(f"{path}: no question records")
    return records


def build_example(question, context, answer, max_length):
    """input_ids and labels as shardlm's build_example: only the context shrinks to fit."""
    head = encode("Question: " + question + " Context: ")
    ctx = encode(context)
    tail = encode(" Answer:")
    ans = encode(" " + answer)
    fixed = 1 + len(head) + len(tail) + len(ans) + 1
    if fixed > max_length:
        raise SystemExit(f"question {question!r}: {fixed} tokens without context, more than max_length {max_length}")
    kept = min(len(ctx), max_length - fixed)
    # shardlm keeps whole characters of the context: a cut inside one moves back to its start.
    while 0 < kept < len(ctx) and (ctx[kept] & 0xC0) == 0x80:
        kept -= 1
    ids = [BOS] + head + ctx[:kept] + tail
    answer_begin = len(ids)
    ids += ans + [EOS]
    # transformers shifts labels by one inside the model: label t is predicted from position t-1,
    # so labels on the answer and EOS are shardlm's targets from the last prompt token on.
    labels = [IGNORE] * answer_begin + ids[answer_begin:]
    return ids, labels


def load_examples(path, max_length):
    return [build_example(q, c, a, max_length) for q, c, a in read_squad(path)]


def token_counts(examples):
    return {"examples": len(examples),
            "tokens": sum(len(ids) for ids, _ in examples),
            "loss_tokens": sum(sum(1 for l in labels if l != IGNORE) for _, labels in examples)}


# ---- training --------------------------------------------------------------------------------

def fsdp_option(a):
    return "full_shard offload auto_wrap" if a.fsdp_offload else "full_shard auto_wrap"


def training_arguments(transformers, a, output_dir):
    """The tutorial's TrainingArguments, tolerant of the renames between transformers 4 and 5."""
    kw = dict(
        output_dir=output_dir,
        per_device_train_batch_size=a.micro_batch,
        gradient_accumulation_steps=a.grad_accum,
        per_device_eval_batch_size=a.eval_batch,
        num_train_epochs=a.epochs,
        learning_rate=a.lr,
        weight_decay=a.weight_decay,
        bf16=True,
        eval_strategy="epoch",
        logging_strategy="steps",
        logging_steps=a.logging_steps,
        save_strategy="no",
        report_to="none",
        seed=a.seed,
        remove_unused_columns=False,   # the collator's batch is exactly what the model takes
        prediction_loss_only=True,     # eval loss only: no logits gathered (Trainer's own choice without compute_metrics)
        disable_tqdm=True,             # log lines, not progress bars, in the captured output
        dataloader_num_workers=0,
    )
    if a.fsdp:
        kw["fsdp"] = fsdp_option(a)
        kw["fsdp_config"] = {"transformer_layer_cls_to_wrap": ["BloomBlock"], "fsdp_version": a.fsdp_version}
    try:
        return transformers.TrainingArguments(**kw)
    except TypeError as e:
        if "eval_strategy" not in str(e):
            raise
        kw["evaluation_strategy"] = kw.pop("eval_strategy")  # transformers before 4.41
        return transformers.TrainingArguments(**kw)


def main():
    a = parse_args()
    t_start = time.time()
    train_examples = load_examples(a.train, a.max_length)
    eval_examples = load_examples(a.dev, a.max_length)
    counts = {"train": token_counts(train_examples), "eval": token_counts(eval_examples)}
    if a.count_tokens:
        print(json.dumps(counts))
        return

    import torch
    import transformers
    from transformers import BloomConfig, BloomForCausalLM, Trainer

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if not torch.cuda.is_available():
        raise SystemExit("hf_trainer_squad.py: no CUDA device (bf16 training on a GPU is what it measures)")
    if world > 1 and not a.fsdp:
        print("hf_trainer_squad.py: several processes without --fsdp: Trainer runs DDP", file=sys.stderr)
    dev = torch.device("cuda", local_rank)
    torch.cuda.set_device(dev)

    class SquadSet(torch.utils.data.Dataset):
        def __init__(self, examples):
            self.examples = examples

        def __len__(self):
            return len(self.examples)

        def __getitem__(self, i):
            ids, labels = self.examples[i]
            return {"input_ids": ids, "labels": labels}

    def collate(batch):
        n = max(len(b["input_ids"]) for b in batch)
        input_ids = torch.full((len(batch), n), PAD, dtype=torch.long)
        labels = torch.full((len(batch), n), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(batch), n), dtype=torch.long)
        for i, b in enumerate(batch):
            k = len(b["input_ids"])
            input_ids[i, :k] = torch.tensor(b["input_ids"])
            labels[i, :k] = torch.tensor(b["labels"])
            mask[i, :k] = 1
        return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}

    torch.manual_seed(a.seed)
    cfg = BloomConfig(vocab_size=a.vocab, hidden_size=a.hidden, n_layer=a.layers, n_head=a.heads,
                      layer_norm_epsilon=1e-5, initializer_range=0.02, hidden_dropout=0.0,
                      attention_dropout=0.0, use_cache=False, tie_word_embeddings=True,
                      bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    with torch.device(dev):  # random init on the GPU: quicker than on the CPU, same weights per seed
        model = BloomForCausalLM(cfg)
    model = model.float()
    n_params = sum(p.numel() for p in model.parameters())

    scratch = a.output_dir or tempfile.mkdtemp(prefix="hf_trainer_squad.")
    args = training_arguments(transformers, a, scratch)
    # No tokenizer object exists (the collator pads), so neither `tokenizer=` (gone in
    # transformers 5) nor its successor `processing_class=` is passed.
    trainer = Trainer(model=model, args=args, train_dataset=SquadSet(train_examples),
                      eval_dataset=SquadSet(eval_examples), data_collator=collate)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(dev)
    setup_seconds = time.time() - t_start
    out = trainer.train()
    torch.cuda.synchronize()

    mem = torch.tensor([torch.cuda.max_memory_allocated(dev), torch.cuda.max_memory_reserved(dev)],
                       dtype=torch.float64, device=dev)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(mem, op=torch.distributed.ReduceOp.MAX)
    if not a.output_dir:
        import shutil
        shutil.rmtree(scratch, ignore_errors=True)
    if not trainer.is_world_process_zero():
        return

    m = out.metrics
    history = trainer.state.log_history
    evals = [h for h in history if "eval_loss" in h]
    try:
        import accelerate
        accelerate_version = accelerate.__version__
    except ImportError:
        accelerate_version = None
    record = {
        "impl": "hf-trainer",
        "label": a.label,
        "mode": f"FSDP{a.fsdp_version} {fsdp_option(a)}" if a.fsdp else "no sharding",
        "gpus": world,
        "gpu_name": torch.cuda.get_device_name(dev),
        "train_runtime": m.get("train_runtime"),
        "train_samples_per_second": m.get("train_samples_per_second"),
        "train_steps_per_second": m.get("train_steps_per_second"),
        "train_loss": m.get("train_loss"),
        "total_flos": m.get("total_flos"),
        "global_step": out.global_step,
        "epochs": a.epochs,
        "eval_loss": [h["eval_loss"] for h in evals],
        "eval_runtime": [h.get("eval_runtime") for h in evals],
        "eval_samples_per_second": [h.get("eval_samples_per_second") for h in evals],
        "train_log": [{k: h[k] for k in ("step", "epoch", "loss", "grad_norm", "learning_rate") if k in h}
                      for h in history if "loss" in h],
        "peak_memory_bytes": mem[0].item(),
        "peak_reserved_bytes": mem[1].item(),
        "setup_seconds": setup_seconds,
        "wall_seconds": time.time() - t_start,
        "train_examples": counts["train"]["examples"],
        "train_tokens_per_epoch": counts["train"]["tokens"],
        "train_loss_tokens_per_epoch": counts["train"]["loss_tokens"],
        "eval_examples": counts["eval"]["examples"],
        "eval_tokens": counts["eval"]["tokens"],
        "max_length": a.max_length,
        "micro_batch": a.micro_batch, "grad_accum": a.grad_accum, "eval_batch": a.eval_batch,
        "lr": a.lr, "weight_decay": a.weight_decay,
        "vocab": a.vocab, "hidden": a.hidden, "layers": a.layers, "heads": a.heads, "params": n_params,
        "optimizer": str(getattr(args.optim, "value", args.optim)),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "torch": torch.__version__, "transformers": transformers.__version__, "accelerate": accelerate_version,
    }
    line = json.dumps(record)
    print(line, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
