#!/usr/bin/env bash
# Collective bandwidth, ours vs raw c10d Gloo, at 2 and 4 ranks (docs/benchmarks.md).
set -euo pipefail
# shellcheck source=bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
build=${1:-build}
bench_header
for n in 2 4; do
  "$build/hyperparallel" run --no-prefix --nproc-per-node "$n" -- "$build/comm_bench" "${ROUNDS:-7}" | \
    { if [ "$n" = 2 ]; then cat; else grep -v '^| ranks\|^|---'; fi; }
done
