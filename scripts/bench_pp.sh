#!/usr/bin/env bash
# FSDP4 vs the pipeline schedules (GPipe, 1F1B, interleaved 1F1B, ZB-H1) on 4 ranks of a 16-layer Llama,
# PP_BENCH_MICROBATCHES micro-batches of 2 x 256 tokens per step, modes interleaved over ROUNDS launches
# each (docs/benchmarks.md "Pipeline parallelism"). NPROC=2 runs 2 stages (one rank per core on a
# 2-core machine), MODES picks modes, PP_BENCH_LAYERS / PP_BENCH_COSTS pass through to pp_bench.
set -euo pipefail
# shellcheck source=bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
build=${1:-build}
steps=${STEPS:-3}
rounds=${ROUNDS:-3}
nproc=${NPROC:-4}
modes=${MODES:-fsdp4 pp4_gpipe pp4_1f1b pp4_interleaved pp4_zero_bubble}
bench_header
for round in $(seq "$rounds"); do
  for mode in $modes; do
    "$build/hyperparallel" run --no-prefix --nproc-per-node "$nproc" -- "$build/pp_bench" "$mode" "$steps" | grep -E 'RESULT|SIMULATED' | paste -sd ' '
  done
done
bench_footer
