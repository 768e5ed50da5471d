#!/usr/bin/env bash
# Tokenizer throughput next to Hugging Face's Rust tokenizers (npm tokenizers@0.23.2) on the
# same ~5 MB text, single thread, in one run (docs/benchmarks.md). The reference needs npm and
# a one-time `npm install tokenizers@0.23.2` into $HF_TOKENIZERS_DIR (default
# build/hf_tokenizers); without it only our numbers are printed.
set -euo pipefail
# shellcheck source=bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
build=${1:-build}
ref=${HF_TOKENIZERS_DIR:-$build/hf_tokenizers}
fixtures=tests/fixtures/tokenizer
text=$(mktemp)
trap 'rm -f "$text"' EXIT
bench_header
for name in qwen3 llama3 mistral; do
  echo "== $name"
  OMP_NUM_THREADS=1 "$build/tokenizer_bench" "$fixtures/$name" "$fixtures/expected/corpus.jsonl" "$text"
  if [ -d "$ref/node_modules/tokenizers" ]; then
    NODE_PATH="$ref/node_modules" TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 \
      node benchmarks/tokenizer_bench_hf.js "$fixtures/$name/tokenizer.json" "$text"
  else
    echo "RESULT impl=hf_tokenizers skipped (npm install --prefix $ref tokenizers@0.23.2)"
  fi
done
