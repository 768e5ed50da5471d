#!/usr/bin/env bash
# FSDP4 vs context parallelism (Ulysses, all-gather, ring, hybrid) on 4 ranks, one global batch of 4 rows x
# CP_BENCH_TOKENS tokens, modes interleaved over ROUNDS launches each; TRACE=path writes the ring's Chrome
# trace (docs/benchmarks.md "Context parallelism").
set -euo pipefail
# shellcheck source=bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
build=${1:-build}
steps=${STEPS:-3}
rounds=${ROUNDS:-3}
bench_header
for round in $(seq "$rounds"); do
  for mode in fsdp4 cp4_ulysses cp4_allgather cp4_ring cp4_hybrid; do
    "$build/hyperparallel" run --no-prefix --nproc-per-node 4 -- "$build/cp_bench" "$mode" "$steps" | grep RESULT
  done
done
if [[ -n "${TRACE:-}" ]]; then
  "$build/hyperparallel" run --no-prefix --nproc-per-node 4 -- "$build/cp_bench" cp4_ring 1 "$TRACE" | grep RESULT
fi
bench_footer
