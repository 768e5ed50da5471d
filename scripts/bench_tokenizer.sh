#!/usr/bin/env bash
# Tokenizer throughput next to Hugging Face's Rust tokenizers (the pinned Python `tokenizers`
# of the project's environment, scripts/requirements.txt) on the same ~5 MB text, single
# thread, in one run (docs/benchmarks.md). Without that package only our numbers are printed.
set -euo pipefail
# shellcheck source=bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
build=${1:-build}
python=$("$(dirname "$0")/python_env.sh")/bin/python
fixtures=tests/fixtures/tokenizer
text=$(mktemp)
trap 'rm -f "$text"' EXIT
bench_header
reference=yes
if ! "$python" -c "import tokenizers" 2>/dev/null; then
  reference=no
fi
for name in qwen3 llama3 mistral; do
  echo "== $name"
  OMP_NUM_THREADS=1 "$build/tokenizer_bench" "$fixtures/$name" "$fixtures/expected/corpus.jsonl" "$text"
  if [ "$reference" = yes ]; then
    TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 "$python" benchmarks/tokenizer_bench_hf.py "$fixtures/$name/tokenizer.json" "$text"
  else
    echo "RESULT impl=hf_tokenizers skipped ($python has no tokenizers; scripts/setup.sh installs it)"
  fi
done
bench_footer
