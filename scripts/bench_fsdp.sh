#!/usr/bin/env bash
# FSDP step time, exposed communication, memory and traffic next to PyTorch's own FSDP2 and
# DDP, at RANKS ranks (default 2): every mode launched LAUNCHES times (default 5), interleaved,
# each launch's median step, reported as the median and min-max over launches, with the
# ratios of the targets (docs/benchmarks.md). Every mode goes through our launcher, so every
# rank gets the same threads (cores / ranks). The PyTorch peers run on the torch of the
# project's Python environment (scripts/setup.sh).
#   single     1 process, no communication (2 threads on 2 cores)
#   local      RANKS ranks, each the whole model on its own rows, no communication: the
#              FSDP step's floor at the same threads per rank
#   ddp, fsdp_unfused, fsdp, fsdp_keep   ours (benchmarks/fsdp_bench.cpp)
#   fsdp2, fsdp2_keep, torch_ddp         PyTorch's (benchmarks/torch_*_bench.py)
#   torch_local  PyTorch's `local`: RANKS ranks of the unsharded model, no communication
# BASE_BUILD=DIR adds fsdp_base, FSDP from another build (an older commit's), to the rounds:
# a before/after measured at the same moments.
set -euo pipefail
# shellcheck source=bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
build=${1:-build}
steps=${STEPS:-6}
launches=${LAUNCHES:-5}
ranks=${RANKS:-2}
run="$build/hyperparallel run --no-prefix"
bench_header
echo "ranks $ranks, threads per rank: $(( $(nproc) / ranks > 0 ? $(nproc) / ranks : 1 )) (the launcher's share)"
modes=(single "$run --nproc-per-node 1 -- $build/fsdp_bench single $steps")
for mode in local ddp fsdp_unfused fsdp fsdp_keep; do
  modes+=("$mode" "$run --nproc-per-node $ranks -- $build/fsdp_bench $mode $steps")
done
if [ -n "${BASE_BUILD:-}" ]; then
  modes+=(fsdp_base "$run --nproc-per-node $ranks -- $BASE_BUILD/fsdp_bench fsdp $steps")
fi
python=$("$(dirname "$0")/python_env.sh")/bin/python
if "$python" -c "import torch" 2>/dev/null; then
  for mode in torch_local fsdp2 fsdp2_keep; do
    modes+=("$mode" "$run --nproc-per-node $ranks -- $python benchmarks/torch_fsdp2_bench.py bench $mode $steps")
  done
  modes+=(torch_ddp "$run --nproc-per-node $ranks -- $python benchmarks/torch_ddp_bench.py $steps")
else
  echo "RESULT mode=fsdp2 skipped (run scripts/setup.sh: the project's Python environment has no torch)"
fi
interleave "$launches" "${modes[@]}"
ratio fsdp fsdp2
ratio fsdp_keep fsdp2_keep
ratio fsdp local
ratio fsdp_keep local
ratio local torch_local
ratio fsdp2 torch_local
ratio fsdp2_keep torch_local
ratio ddp torch_ddp
ratio fsdp ddp
if [ -n "${BASE_BUILD:-}" ]; then
  ratio fsdp fsdp_base
fi
bench_footer
