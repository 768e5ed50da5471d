#!/usr/bin/env python3
"""The Hugging Face reference for benchmarks/tokenizer_bench.cpp: the pinned Python `tokenizers`
(its Rust core) encodes the same text file in one call, best of 3, on one thread (Rayon's pool
pinned to 1 and tokenizers' parallelism off before the import). Prints the RESULT line of
tokenizer_bench (impl=hf_tokenizers).
  tokenizer_bench_hf.py TOKENIZER_JSON TEXT_FILE
"""
import os
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import Tokenizer  # noqa: E402  (after the thread settings)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: tokenizer_bench_hf.py TOKENIZER_JSON TEXT_FILE")
    tokenizer = Tokenizer.from_file(sys.argv[1])
    with open(sys.argv[2], "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8")  # the exact bytes: no newline translation
    best, ids = 1e9, 0
    for _ in range(3):
        start = time.perf_counter()
        encoding = tokenizer.encode(text, add_special_tokens=False)
        best = min(best, time.perf_counter() - start)
        ids = len(encoding.ids)
    print(f"RESULT impl=hf_tokenizers bytes={len(raw)} ids={ids} seconds={best:.3f} mb_per_s={len(raw) / best / 1e6:.2f}")


if __name__ == "__main__":
    main()
