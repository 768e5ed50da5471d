#!/usr/bin/env bash
# Collective bandwidth, ours vs raw c10d Gloo, at 2 and 4 ranks (docs/benchmarks.md).
set -euo pipefail
build=${1:-build}
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d), $(nproc) cores"
for n in 2 4; do
  "$build/hyperparallel" run --no-prefix --nproc-per-node "$n" -- "$build/comm_bench" "${ROUNDS:-7}" | \
    { if [ "$n" = 2 ]; then cat; else grep -v '^| ranks\|^|---'; fi; }
done
