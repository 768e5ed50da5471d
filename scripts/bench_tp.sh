#!/usr/bin/env bash
# TP4 vs FSDP4 vs FSDP2 x TP2 (and TP4 in Validation mode) on 4 ranks, a ~48 M Qwen3, modes interleaved over ROUNDS
# launches each (docs/benchmarks.md "Tensor parallelism").
set -euo pipefail
build=${1:-build}
steps=${STEPS:-4}
rounds=${ROUNDS:-2}
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d), $(nproc) cores," \
     "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$rounds"); do
  for mode in fsdp4 tp4 fsdp2_tp2 tp4_validate; do
    "$build/hyperparallel" run --no-prefix --nproc-per-node 4 -- "$build/tp_bench" "$mode" "$steps" | grep RESULT
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
