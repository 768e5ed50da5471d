#!/usr/bin/env bash
# Activation memory and step time with and without activation checkpointing and chunked loss (one process, a ~48 M
# Qwen3), modes interleaved over ROUNDS launches each (docs/benchmarks.md "Memory").
set -euo pipefail
build=${1:-build}
steps=${STEPS:-3}
rounds=${ROUNDS:-3}
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d), $(nproc) cores," \
     "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$rounds"); do
  for mode in plain ac_full ac_every2 selective chunked ac_chunked; do
    "$build/memory_bench" "$mode" "$steps" | grep RESULT
    "$build/memory_bench" "$mode" "$steps" cached | grep RESULT
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
