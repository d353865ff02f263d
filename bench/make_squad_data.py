#!/usr/bin/env python3
"""Write synthetic SQuAD v1.1 files (train-v1.1.json, dev-v1.1.json) shaped like the real set.

For benchmarks on machines that cannot download the official files: the JSON layout is SQuAD
v1.1's (data[].title, .paragraphs[].context, .qas[].id/question/answers[].text/answer_start),
contexts are 600-900 characters of English-looking filler sentences (the real median is about
700), questions about 60 characters, answers a few words long and always a span of the context
at answer_start. Training questions carry one answer, dev questions one to three (as the real
dev set, whose extra answers are often the same span or a shorter one). Ids are 24 hex digits,
unique over both files. The same --seed gives the same bytes. Pure standard library.

    python3 bench/make_squad_data.py --train 250 --dev 100 --seed 42 --out /tmp/squad
"""
import argparse
import json
import os
import random

ADJECTIVES = [
    "ancient", "northern", "wooden", "famous", "quiet", "large", "early", "royal", "coastal",
    "eastern", "narrow", "public", "modern", "central", "small", "western", "golden", "stone",
    "rural", "old", "busy", "southern", "broad", "local", "sacred", "frozen", "painted", "iron",
]
NOUNS = [
    "bridge", "library", "harbour", "festival", "railway", "cathedral", "market", "treaty",
    "university", "garden", "canal", "fortress", "council", "museum", "mill", "theatre", "lighthouse",
    "monastery", "observatory", "archive", "guild", "tower", "academy", "orchard", "chapel", "road",
]
VERBS = [  # (past tense, base form)
    ("built", "build"), ("founded", "found"), ("restored", "restore"), ("visited", "visit"),
    ("designed", "design"), ("funded", "fund"), ("opened", "open"), ("described", "describe"),
    ("expanded", "expand"), ("mapped", "map"), ("defended", "defend"), ("renamed", "rename"),
]
FILLER_VERBS = [
    "was mentioned in", "stood beside", "attracted visitors to", "shaped the history of",
    "remained important for", "was later linked to", "gave its name to", "was rebuilt after",
    "brought trade to", "was studied by scholars of", "declined during the wars of",
    "was painted by artists from",
]
FILLER_TAILS = [
    "for several centuries", "during the long winters", "according to local records",
    "in the years that followed", "until the end of the period", "by most accounts",
    "as travellers often noted", "throughout the region", "with modest success",
    "despite repeated floods", "long before the modern era", "in a number of ways",
]
SYLLABLES = ["ar", "bel", "cor", "dan", "el", "fen", "gar", "hol", "is", "kor", "lan", "mor",
             "nor", "os", "pel", "ran", "sel", "tor", "ul", "ven", "wen", "yar", "zel", "mar"]
FIRST_NAMES = ["Anna", "Bernard", "Clara", "Dmitri", "Elena", "Felix", "Greta", "Hugo", "Ines",
               "Jonas", "Karin", "Lucas", "Marta", "Nils", "Olga", "Pavel", "Rosa", "Stefan",
               "Tilde", "Viktor"]

CONTEXT_MIN, CONTEXT_MAX = 600, 900
SENTENCE_MAX = 120  # a filler sentence never overshoots the target by more than this


def place(rng):
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def person(rng):
    return f"{rng.choice(FIRST_NAMES)} {place(rng)}"


def filler(rng):
    """One English-looking sentence that answers nothing, at most SENTENCE_MAX characters."""
    while True:
        s = (f"The {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} of {place(rng)} "
             f"{rng.choice(FILLER_VERBS)} the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} "
             f"{rng.choice(FILLER_TAILS)}.")
        if len(s) <= SENTENCE_MAX:
            return s


def fact(rng):
    """A sentence and one question about it: (sentence, question, answer, offset of answer in sentence)."""
    who, where = person(rng), place(rng)
    past, base = rng.choice(VERBS)
    adj, noun = rng.choice(ADJECTIVES), rng.choice(NOUNS)
    year = str(rng.randint(1150, 1950))
    thing = f"the {adj} {noun}"
    sentence = f"In {year}, {who} {past} {thing} near {where}."
    kind = rng.randrange(4)
    if kind == 0:
        question, answer = f"Who {past} {thing} near the town of {where} in {year}?", who
    elif kind == 1:
        question, answer = f"In which year did {who} {base} {thing} near {where}?", year
    elif kind == 2:
        question, answer = f"What did {who} {base} near the town of {where} in {year}?", thing
    else:
        question, answer = f"Near which town did {who} {base} {thing} in {year}?", where
    return sentence, question, answer, sentence.index(answer)


def paragraph(rng, n_questions, ids, dev):
    """A context of CONTEXT_MIN..CONTEXT_MAX characters holding n_questions answered facts."""
    while True:
        facts = [fact(rng) for _ in range(n_questions)]
        target = rng.randint(CONTEXT_MIN, CONTEXT_MAX - SENTENCE_MAX)
        sentences = [f[0] for f in facts]
        while len(" ".join(sentences)) < target:
            sentences.insert(rng.randint(0, len(sentences)), filler(rng))
        context = " ".join(sentences)
        if CONTEXT_MIN <= len(context) <= CONTEXT_MAX:
            break
    qas = []
    for sentence, question, answer, offset in facts:
        start = context.index(sentence) + offset  # fact sentences are unique (year, name, place)
        answers = [{"text": answer, "answer_start": start}]
        if dev:  # the real dev set has up to three, often the same span or a shorter one
            for _ in range(rng.randint(0, 2)):
                if answer.startswith("the ") and rng.random() < 0.5:
                    answers.append({"text": answer[4:], "answer_start": start + 4})
                else:
                    answers.append({"text": answer, "answer_start": start})
        while True:
            qid = f"{rng.getrandbits(96):024x}"
            if qid not in ids:
                ids.add(qid)
                break
        qas.append({"id": qid, "question": question, "answers": answers})
    return {"context": context, "qas": qas}


def dataset(rng, n, ids, dev):
    """n questions in articles of a few paragraphs, one to three questions a paragraph."""
    articles, left = [], n
    while left > 0:
        paragraphs = []
        for _ in range(rng.randint(2, 5)):
            if left == 0:
                break
            k = min(left, rng.randint(1, 3))
            paragraphs.append(paragraph(rng, k, ids, dev))
            left -= k
        articles.append({"title": f"{place(rng)}_{rng.choice(NOUNS).capitalize()}", "paragraphs": paragraphs})
    return {"version": "1.1", "data": articles}


def check(data):
    """Every answer is its context's span at answer_start (the property the files promise)."""
    for article in data["data"]:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                for a in qa["answers"]:
                    s = a["answer_start"]
                    assert p["context"][s:s + len(a["text"])] == a["text"], (qa["id"], a)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", type=int, default=250, help="training questions (default 250)")
    p.add_argument("--dev", type=int, default=100, help="dev questions (default 100)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", required=True, help="output folder: train-v1.1.json and dev-v1.1.json")
    a = p.parse_args()
    if a.train < 1 or a.dev < 0:
        p.error("--train must be >= 1 and --dev >= 0")
    os.makedirs(a.out, exist_ok=True)
    ids = set()
    # One generator per file, so the training set does not change with --dev.
    for name, n, dev, stream in (("train-v1.1.json", a.train, False, 0), ("dev-v1.1.json", a.dev, True, 1)):
        data = dataset(random.Random(a.seed * 2 + stream), n, ids, dev)
        check(data)
        with open(os.path.join(a.out, name), "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
    print(f"make_squad_data: {a.train} training and {a.dev} dev questions in {a.out} (seed {a.seed})")


if __name__ == "__main__":
    main()
