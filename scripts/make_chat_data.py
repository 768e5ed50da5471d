#!/usr/bin/env python3
"""Chat records with the length spread of real chat data, made here so that nothing is downloaded.

Design. Real SFT chat data (ShareGPT-style dumps, LlamaFactory's alpaca demos) has short
prompts, longer answers, a long tail of very long exchanges and some multi-turn conversations.
This writes `count` conversations in LlamaFactory's sharegpt format:
  - turns: 1 exchange (75 %), 2 (17 %) or 3 (8 %);
  - a prompt's words: lognormal, median 28, sigma 0.9; an answer's: lognormal, median 110,
    sigma 0.85. With the Qwen3 tokenizer (default 1000 records, seed 0): a record's tokens
    median 260, p90 722, mean 359; one in five (22 %) is past 512 and cut there;
  - the words: drawn from the English text of a seed file (LlamaFactory's alpaca_en_demo.json,
    shipped under tests/fixtures/llamafactory/data), with sentence ends and line breaks, so a
    real BPE tokenizer sees real words.
Python's `random` (Mersenne Twister) seeded with --seed: the same file on every machine and
Python 3 version. Writes FILE and dataset_info.json beside it naming it `chat_demo`.

Usage: python scripts/make_chat_data.py --out /tmp/data/chat_demo.json [--count 1000] [--seed 0]
"""
import argparse
import json
import os
import random
import re

HERE = os.path.dirname(os.path.abspath(__file__))
SEED_TEXT = os.path.join(HERE, "..", "tests", "fixtures", "llamafactory", "data", "alpaca_en_demo.json")


def seed_words():
    with open(SEED_TEXT, encoding="utf-8") as f:
        records = json.load(f)
    text = " ".join(r.get("instruction", "") + " " + r.get("output", "") for r in records)
    words = re.findall(r"[A-Za-z][A-Za-z'-]*", text)
    return sorted(set(w.lower() for w in words))


def passage(rng, words, count):
    out, sentence = [], 0
    for _ in range(max(1, count)):
        word = rng.choice(words)
        out.append(word.capitalize() if sentence == 0 else word)
        sentence += 1
        if sentence > 6 and rng.random() < 0.12:
            out[-1] += "."
            sentence = 0
            if rng.random() < 0.15:
                out[-1] += "\n"
    text = " ".join(out).replace("\n ", "\n")
    return text if text.endswith((".", "\n")) else text + "."


def conversation(rng, words):
    turns = rng.choices([1, 2, 3], weights=[75, 17, 8])[0]
    messages = []
    for _ in range(turns):
        messages.append({"from": "human", "value": passage(rng, words, round(rng.lognormvariate(3.33, 0.9)))})
        messages.append({"from": "gpt", "value": passage(rng, words, round(rng.lognormvariate(4.70, 0.85)))})
    return {"conversations": messages}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file to write (dataset_info.json goes beside it)")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    words = seed_words()
    records = [conversation(rng, words) for _ in range(args.count)]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(records, f, ensure_ascii=False, indent=1)
    info = {"chat_demo": {"file_name": os.path.basename(args.out), "formatting": "sharegpt",
                          "columns": {"messages": "conversations"}}}
    with open(os.path.join(os.path.dirname(os.path.abspath(args.out)), "dataset_info.json"), "w") as f:
        json.dump(info, f, indent=1)
    lengths = sorted(sum(len(m["value"].split()) for m in r["conversations"]) for r in records)
    print(f"{args.out}: {len(records)} conversations, words per record median {lengths[len(lengths) // 2]}, "
          f"p90 {lengths[int(len(lengths) * 0.9)]}, max {lengths[-1]}")


if __name__ == "__main__":
    main()
