#!/usr/bin/env bash
# FSDP step time, exposed communication, memory and traffic next to 1 process, our DDP and
# PyTorch DDP, 2 ranks, in one run (docs/benchmarks.md). PyTorch DDP needs python3-torch.
set -euo pipefail
# shellcheck source=bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
build=${1:-build}
steps=${STEPS:-6}
run="$build/hyperparallel run --no-prefix"
bench_header
$run --nproc-per-node 1 -- "$build/fsdp_bench" single "$steps" | grep RESULT
for mode in ddp fsdp_unfused fsdp; do
  $run --nproc-per-node 2 -- "$build/fsdp_bench" "$mode" "$steps" | grep RESULT
done
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  $run --nproc-per-node 2 -- /usr/bin/python3 benchmarks/torch_ddp_bench.py "$steps" | grep RESULT
else
  echo "RESULT mode=torch_ddp skipped (install python3-torch)"
fi
