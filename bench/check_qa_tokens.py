#!/usr/bin/env python3
"""shardlm's SQuAD samples against Hugging Face `tokenizers`, sample by sample.

    build/bin/shardlm preprocess DECK --data.tokenizer=TOKENIZER_JSON --out samples.jsonl
    python3 bench/check_qa_tokens.py --tokenizer TOKENIZER_JSON --squad TRAIN.json --samples samples.jsonl \
        --max-length 512 [--bos-token '<s>'] --eos-token '</s>'

Builds each SQuAD record's sample as src/data/squad.cpp does, with `tokenizers` in place of shardlm's
tokenizer: "Question: {q} Context: {c} Answer:" + " {first answer}" tokenized whole (no special tokens),
[BOS] before and [EOS] after, the loss from the first token that overlaps the answer (the whole text's
tokens against the prompt's alone, as TRL places a completion), and a sample longer than --max-length
keeping the start of its context that squad.cpp's context_kept keeps, found by the same steps.
Then compares input_ids and loss_mask with `shardlm preprocess --out`'s lines, and counts what the
layout before 2026-12-01 gave (each piece tokenized on its own: a SentencePiece tokenizer's stray "▁"
at every seam, a byte-level one's lone "Ġ").

Prints one JSON line: samples, equal, differing (with the first few), cut, how many more tokens the
old layout gave over all samples, and how many of its answers began with a whitespace-only token (with
a subword tokenizer a stray one; a byte tokenizer's answers all begin with the space byte).
Exit status 1 if any sample differs.
"""
import argparse
import json
import math
import sys

from tokenizers import Tokenizer


def read_squad(path):
    with open(path, encoding="utf-8") as f:
        root = json.load(f)
    return [(qa["question"], p["context"], qa["answers"][0]["text"])
            for a in root["data"] for p in a["paragraphs"] for qa in p["qas"]]


def common_prefix(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


class Builder:
    def __init__(self, tok, bos, eos, max_length):
        self.tok, self.bos, self.eos, self.max_length = tok, bos, eos, max_length
        self.specials = (1 if bos is not None else 0) + 1

    def ids(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    @staticmethod
    def prompt(q, cb, n):
        return "Question: " + q + " Context: " + cb[:n].decode("utf-8") + " Answer:"

    def qa_tokens(self, q, cb, n, a):
        return len(self.ids(self.prompt(q, cb, n) + " " + a))

    def context_kept(self, q, cb, a):
        """src/data/squad.cpp's context_kept, step for step."""
        room = self.max_length - min(self.specials, self.max_length)
        whole = self.qa_tokens(q, cb, len(cb), a)
        if whole <= room:
            return len(cb), False
        if self.qa_tokens(q, cb, 0, a) > room:
            raise SystemExit(f"question {q!r}: no room for the context at --max-length {self.max_length}")
        b = {"lo": 0, "hi": len(cb)}

        def inside(at):
            return (cb[at] & 0xC0) == 0x80

        def char_start(at):
            lo, hi = b["lo"], b["hi"]
            if hi - lo <= 1:
                return hi
            start = min(max(at, lo + 1), hi - 1)
            p = start
            while p > lo and inside(p):
                p -= 1
            if p > lo:
                return p
            p = start
            while p < hi and inside(p):
                p += 1
            return p

        def probe(at):
            fits = self.qa_tokens(q, cb, at, a) <= room
            b["lo" if fits else "hi"] = at
            return fits

        per_token = (len(self.prompt(q, cb, len(cb)).encode("utf-8")) + len((" " + a).encode("utf-8"))) / whole
        over = math.ceil((whole - room) * per_token)
        step = max(16, math.ceil(4 * per_token))
        at = char_start(len(cb) - min(len(cb), over))
        if at != b["hi"] and probe(at):
            while True:
                at = char_start(b["lo"] + step)
                if at == b["hi"] or not probe(at):
                    break
                step *= 2
        elif at != b["hi"]:
            while True:
                at = char_start(b["hi"] - step if b["hi"] > step else 0)
                if at == b["hi"] or probe(at):
                    break
                step *= 2
        while True:
            at = char_start(b["lo"] + (b["hi"] - b["lo"]) // 2)
            if at == b["hi"]:
                break
            probe(at)
        return b["lo"], True

    def first_token_from(self, head, ids):
        """src/data/token_spans.cpp's first_token_from: the first token that overlaps what follows head."""
        head_ids = self.ids(head)
        first = common_prefix(head_ids, ids)
        start = max(first - 1, 0)  # decoded from the last shared token on, both
        rest = self.tok.decode(head_ids[start:])
        decoded = len(self.tok.decode(ids[start:first]).encode("utf-8"))
        while first < len(ids):
            d = self.tok.decode(ids[start:first + 1])
            if len(d.encode("utf-8")) <= decoded or not rest.startswith(d):
                break
            decoded = len(d.encode("utf-8"))
            first += 1
        return first

    def sample(self, q, c, a):
        cb = c.encode("utf-8")
        kept, cut = self.context_kept(q, cb, a)
        prompt = self.prompt(q, cb, kept)
        ids = self.ids(prompt + " " + a)
        begin = self.first_token_from(prompt, ids)
        head = [self.bos] if self.bos is not None else []
        tokens = head + ids + [self.eos]
        answer_begin = len(head) + begin
        mask = [1 if t >= answer_begin else 0 for t in range(len(tokens))]
        return tokens, mask, cut

    def old_sample(self, q, c, a):
        head, ctx, tail, ans = (self.ids("Question: " + q + " Context: "), self.ids(c), self.ids(" Answer:"),
                                self.ids(" " + a))
        fixed = self.specials + len(head) + len(tail) + len(ans)
        kept = min(len(ctx), self.max_length - fixed)
        return head + ctx[:kept] + tail, ans


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokenizer", required=True, help="tokenizer.json")
    p.add_argument("--squad", required=True, help="the SQuAD v1.1 file the samples came from")
    p.add_argument("--samples", required=True, help="shardlm preprocess --out's JSON lines")
    p.add_argument("--max-length", type=int, required=True)
    p.add_argument("--bos-token", help="BOS's text (none: samples start without one)")
    p.add_argument("--eos-token", required=True)
    a = p.parse_args()
    tok = Tokenizer.from_file(a.tokenizer)
    bos = tok.token_to_id(a.bos_token) if a.bos_token else None
    eos = tok.token_to_id(a.eos_token)
    if eos is None or (a.bos_token and bos is None):
        raise SystemExit("the BOS or EOS token is not in the tokenizer's vocabulary")
    build = Builder(tok, bos, eos, a.max_length)
    records = read_squad(a.squad)
    with open(a.samples, encoding="utf-8") as f:
        samples = [json.loads(line) for line in f if line.strip()]
    if len(samples) != len(records):
        raise SystemExit(f"{len(samples)} samples against {len(records)} records")
    equal, differing, cut, old_more, old_blank_answers = 0, [], 0, 0, 0
    for i, ((q, c, ans), s) in enumerate(zip(records, samples)):
        tokens, mask, was_cut = build.sample(q, c, ans)
        cut += was_cut
        if tokens == s["input_ids"] and mask == s["loss_mask"]:
            equal += 1
        elif len(differing) < 5:
            differing.append({"record": i, "shardlm": len(s["input_ids"]), "tokenizers": len(tokens),
                              "first_difference": common_prefix(tokens, s["input_ids"])})
        else:
            differing.append({"record": i})
        prompt, answer = build.old_sample(q, c, ans)
        old_more += len(prompt) + len(answer) + build.specials - len(tokens)
        old_blank_answers += bool(answer) and tok.decode([answer[0]]).strip() == ""
    print(json.dumps({"samples": len(samples), "equal": equal, "differing": len(differing),
                      "first_differences": differing[:5], "cut": cut,
                      "old_layout_more_tokens": old_more,
                      "old_layout_answers_starting_with_a_blank_token": old_blank_answers}))
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
