#!/usr/bin/env bash
# Data preparation (docs/benchmarks.md "Tokenizing once"): the LlamaFactory benchmark's config
# and chat data (scripts/bench_vs_llamafactory.sh makes them in WORK), scaled to COUNT
# conversations, prepared by benchmarks/data_bench.cpp in four modes, interleaved for ROUNDS:
#   memory_1   no cache, 1 thread        memory_N   no cache, every core
#   cold_N     empty cache, every core   warm       the cache cold_N just wrote
# and LlamaFactory's own get_dataset on the same config in its environment (lf_N: its
# preprocessing_num_workers = every core, overwrite_cache so HF datasets does not reuse a run).
#   scripts/bench_data.sh [BUILD_DIR]     env: COUNT (20000), ROUNDS (3), WORK (/tmp/hp_bench_lf)
set -euo pipefail
# shellcheck source=bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
build=${1:-build}
count=${COUNT:-20000}
rounds=${ROUNDS:-3}
work=${WORK:-/tmp/hp_bench_lf}
python=$("$(dirname "$0")/python_env.sh")/bin/python
model=$work/qwen3_103m
[ -f "$model/tokenizer.json" ] || { echo "run scripts/bench_vs_llamafactory.sh first (it makes $model)"; exit 2; }
data=$work/data_$count
[ -f "$data/chat_demo.json" ] || "$python" scripts/make_chat_data.py --out "$data/chat_demo.json" --count "$count"
cores=$(nproc)
yaml=$work/data_bench.yaml
sed -e "s#@MODEL@#$model#" -e "s#@DATA@#$data#" -e "s#^output_dir:.*#output_dir: $work/out_data_bench#" -e "s#@STEPS@#1#" \
  -e "s#@BF16@#false#" -e "s#^max_samples:.*#max_samples: $count#" benchmarks/llamafactory_qwen3_full_sft.yaml > "$yaml"
cache=$work/data_bench_cache
lf_python=$(ls -d "$HOME"/.cache/hyperparallel/lfenv-*/bin/python 2>/dev/null | head -1 || true)
bench_header
for round in $(seq "$rounds"); do
  echo "== round $round"
  rm -rf "$cache"
  echo "mode=memory_1 $("$build/data_bench" "$yaml" tokenized_cache_dir=none preprocessing_num_workers=1)"
  echo "mode=memory_$cores $("$build/data_bench" "$yaml" tokenized_cache_dir=none preprocessing_num_workers="$cores")"
  echo "mode=cold_$cores $("$build/data_bench" "$yaml" tokenized_cache_dir="$cache" preprocessing_num_workers="$cores")"
  echo "mode=warm $("$build/data_bench" "$yaml" tokenized_cache_dir="$cache")"
  if [ -n "$lf_python" ]; then
    echo "mode=lf_$cores $("$lf_python" benchmarks/llamafactory_data_bench.py "$yaml" "$cores" 2>/dev/null | grep RESULT)"
  fi
done
rm -rf "$cache"
bench_footer
