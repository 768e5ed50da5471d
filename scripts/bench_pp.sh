#!/usr/bin/env bash
# FSDP4 vs the pipeline schedules (GPipe, 1F1B, interleaved 1F1B, ZB-H1) on 4 ranks of a 16-layer Llama,
# PP_BENCH_MICROBATCHES micro-batches of 2 x 256 tokens per step, modes interleaved over ROUNDS launches
# each (docs/benchmarks.md "Pipeline parallelism").
set -euo pipefail
# shellcheck source=bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
build=${1:-build}
steps=${STEPS:-3}
rounds=${ROUNDS:-3}
bench_header
for round in $(seq "$rounds"); do
  for mode in fsdp4 pp4_gpipe pp4_1f1b pp4_interleaved pp4_zero_bubble; do
    "$build/hyperparallel" run --no-prefix --nproc-per-node 4 -- "$build/pp_bench" "$mode" "$steps" | grep RESULT
  done
done
bench_footer
