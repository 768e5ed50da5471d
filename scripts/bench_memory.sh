#!/usr/bin/env bash
# Activation memory and step time with and without activation checkpointing and chunked loss (one process, a ~48 M
# Qwen3) and with the optimizer's moments offloaded to a file, modes interleaved over ROUNDS launches each
# (MODES picks some; docs/benchmarks.md "Memory").
set -euo pipefail
# shellcheck source=bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
build=${1:-build}
steps=${STEPS:-3}
rounds=${ROUNDS:-3}
bench_header
for round in $(seq "$rounds"); do
  for mode in ${MODES:-plain ac_full ac_every2 selective selective_core chunked ac_chunked fused offload}; do
    "$build/memory_bench" "$mode" "$steps" | grep RESULT
    "$build/memory_bench" "$mode" "$steps" cached | grep RESULT
  done
done
bench_footer
