#!/usr/bin/env bash
# TP4 vs FSDP4 vs FSDP2 x TP2 (and TP4 in Validation mode) on 4 ranks, a ~48 M Qwen3, modes interleaved over ROUNDS
# launches each (docs/benchmarks.md "Tensor parallelism").
set -euo pipefail
# shellcheck source=bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
build=${1:-build}
steps=${STEPS:-4}
rounds=${ROUNDS:-2}
bench_header
for round in $(seq "$rounds"); do
  for mode in fsdp4 tp4 fsdp2_tp2 tp4_validate; do
    "$build/hyperparallel" run --no-prefix --nproc-per-node 4 -- "$build/tp_bench" "$mode" "$steps" | grep RESULT
  done
done
bench_footer
