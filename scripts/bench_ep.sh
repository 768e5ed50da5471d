#!/usr/bin/env bash
# FSDP4 (loop and grouped experts) vs EP4 vs EP2 x edp2 on 4 ranks, a 16-expert Qwen3-MoE, modes interleaved over
# ROUNDS launches each (docs/benchmarks.md "Expert parallelism").
set -euo pipefail
build=${1:-build}
steps=${STEPS:-4}
rounds=${ROUNDS:-3}
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d), $(nproc) cores," \
     "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$rounds"); do
  for mode in fsdp4 fsdp4_grouped ep4 ep2_edp2; do
    "$build/hyperparallel" run --no-prefix --nproc-per-node 4 -- "$build/ep_bench" "$mode" "$steps" | grep RESULT
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
