#!/usr/bin/env python3
"""Our tokenizer against Hugging Face's `tokenizers` (the pinned Python package, its Rust core)
on the shipped corpora: every text of tests/fixtures/tokenizer/expected/corpus.jsonl goes
through `hyperparallel tokenize --model <dir> --jsonl` and through tokenizers'
encode(text, add_special_tokens=False), for each tokenizer folder, and the ids must be equal.
The first mismatch of each tokenizer is printed with its record and the first differing
position. Exit 0 when all match, 1 on a mismatch, 77 (ctest's skip code) when this Python has
no `tokenizers`.
  tokenizer_parity.py --cli build/hyperparallel [--fixtures tests/fixtures/tokenizer] [--names qwen3,llama3,mistral]
"""
import argparse
import json
import os
import subprocess
import sys

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
SKIP = 77


def read_corpus(path):
    """Records split on '\\n' only: texts hold raw U+0085 / U+2028 / U+2029 (fixture README)."""
    with open(path, "rb") as f:
        return [json.loads(line) for line in f.read().split(b"\n") if line]


def ours(cli, folder, texts):
    stdin = "".join(json.dumps(t) + "\n" for t in texts)  # ASCII-escaped JSON strings
    result = subprocess.run([cli, "tokenize", "--model", folder, "--jsonl"], input=stdin.encode(),
                            capture_output=True, timeout=120)
    if result.returncode != 0:
        sys.exit(f"{cli} tokenize --model {folder} --jsonl failed ({result.returncode}): {result.stderr.decode()[-2000:]}")
    lines = result.stdout.decode().split("\n")[:-1]
    if len(lines) != len(texts):
        sys.exit(f"{folder}: {len(lines)} output lines for {len(texts)} texts")
    return [json.loads(line) for line in lines]


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def report(name, record, mine, theirs):
    i = first_difference(mine, theirs)
    text = record["text"]
    print(f"MISMATCH {name}: record id={record['id']} category={record['category']} "
          f"({len(mine)} ids ours, {len(theirs)} tokenizers), first difference at index {i}")
    print(f"  text: {json.dumps(text[:300])}{' ...' if len(text) > 300 else ''}")
    print(f"  ours[{max(0, i - 3)}:{i + 5}]       = {mine[max(0, i - 3):i + 5]}")
    print(f"  tokenizers[{max(0, i - 3)}:{i + 5}] = {theirs[max(0, i - 3):i + 5]}")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cli", required=True, help="the hyperparallel tool")
    parser.add_argument("--fixtures", default=os.path.join(here, "fixtures", "tokenizer"))
    parser.add_argument("--names", default="qwen3,llama3,mistral")
    args = parser.parse_args()
    try:
        import tokenizers
    except ImportError as e:
        print(f"SKIP: {sys.executable} has no tokenizers ({e}); scripts/setup.sh installs the pinned one")
        return SKIP

    records = read_corpus(os.path.join(args.fixtures, "expected", "corpus.jsonl"))
    texts = [r["text"] for r in records]
    failed = False
    for name in args.names.split(","):
        folder = os.path.join(args.fixtures, name)
        reference = tokenizers.Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        theirs = [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
        mine = ours(args.cli, folder, texts)
        bad = [k for k in range(len(texts)) if mine[k] != theirs[k]]
        ids = sum(len(t) for t in theirs)
        print(f"{name}: {len(texts) - len(bad)}/{len(texts)} records equal ({ids} ids), tokenizers {tokenizers.__version__}")
        if bad:
            failed = True
            report(name, records[bad[0]], mine[bad[0]], theirs[bad[0]])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
