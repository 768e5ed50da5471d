#!/usr/bin/env bash
# FSDP4 (loop and grouped experts) vs EP4 vs EP2 x edp2 on 4 ranks, a 16-expert Qwen3-MoE, modes interleaved over
# ROUNDS launches each (docs/benchmarks.md "Expert parallelism").
set -euo pipefail
# shellcheck source=bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
build=${1:-build}
steps=${STEPS:-4}
rounds=${ROUNDS:-3}
bench_header
for round in $(seq "$rounds"); do
  for mode in fsdp4 fsdp4_grouped ep4 ep2_edp2; do
    "$build/hyperparallel" run --no-prefix --nproc-per-node 4 -- "$build/ep_bench" "$mode" "$steps" | grep RESULT
  done
done
bench_footer
