#!/usr/bin/env bash
# FSDP step time, exposed communication, memory and traffic next to 1 process, our bucketed
# DDP and PyTorch DDP, 2 ranks: every mode launched LAUNCHES times (default 5), interleaved,
# each launch's median step, reported as the median and min-max over launches, with the
# ratios of the targets (docs/benchmarks.md). PyTorch DDP runs on the torch of the project's
# Python environment (scripts/setup.sh).
# BASE_BUILD=DIR adds fsdp_base, FSDP from another build (an older commit's), to the rounds:
# a before/after measured at the same moments.
set -euo pipefail
# shellcheck source=bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
build=${1:-build}
steps=${STEPS:-6}
launches=${LAUNCHES:-5}
run="$build/hyperparallel run --no-prefix"
bench_header
modes=(single "$run --nproc-per-node 1 -- $build/fsdp_bench single $steps")
for mode in ddp fsdp_unfused fsdp fsdp_keep; do
  modes+=("$mode" "$run --nproc-per-node 2 -- $build/fsdp_bench $mode $steps")
done
if [ -n "${BASE_BUILD:-}" ]; then
  modes+=(fsdp_base "$run --nproc-per-node 2 -- $BASE_BUILD/fsdp_bench fsdp $steps")
fi
python=$("$(dirname "$0")/python_env.sh")/bin/python
if "$python" -c "import torch" 2>/dev/null; then
  modes+=(torch_ddp "$run --nproc-per-node 2 -- $python benchmarks/torch_ddp_bench.py $steps")
else
  echo "RESULT mode=torch_ddp skipped (run scripts/setup.sh: the project's Python environment has no torch)"
fi
interleave "$launches" "${modes[@]}"
ratio fsdp torch_ddp
ratio fsdp ddp
ratio fsdp_keep torch_ddp
ratio fsdp_keep ddp
ratio ddp torch_ddp
if [ -n "${BASE_BUILD:-}" ]; then
  ratio fsdp fsdp_base
  ratio fsdp_base ddp
fi
bench_footer
