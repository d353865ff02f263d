#!/usr/bin/env python3
"""Write a JSON-lines file of {"text": ...} records for shardlm's throughput benchmark.

Every record fills `--seq` tokens under shardlm's byte tokenizer: a `text` record becomes
[BOS] + one token per UTF-8 byte + [EOS] and is cut to data.max_length from the end
(src/data/jsonl.cpp), so a text of at least seq - 1 ASCII bytes gives exactly seq tokens and no
padding. The text is pseudo-random lowercase words (seeded, so the file is reproducible); what it
says does not matter for throughput.

    python3 bench/make_bench_data.py --out /tmp/bench.jsonl --seq 512 --records 960
"""
import argparse
import json
import random
import string


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output .jsonl path")
    p.add_argument("--seq", type=int, required=True, help="tokens per sample (data.max_length)")
    p.add_argument("--records", type=int, required=True, help="number of records (>= steps x global batch)")
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args()
    if a.seq < 8 or a.records < 1:
        p.error("--seq must be >= 8 and --records >= 1")

    rng = random.Random(a.seed)
    # seq - 1 bytes already fill the sample with BOS; a few more guarantee the cut.
    need = a.seq + 16
    with open(a.out, "w", encoding="ascii") as f:
        for _ in range(a.records):
            words, n = [], 0
            while n < need:
                w = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9)))
                words.append(w)
                n += len(w) + 1
            f.write(json.dumps({"text": " ".join(words)}) + "\n")


if __name__ == "__main__":
    main()
