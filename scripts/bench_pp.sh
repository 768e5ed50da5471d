#!/usr/bin/env bash
# FSDP4 vs the pipeline schedules (GPipe, 1F1B, interleaved 1F1B, ZB-H1) on 4 ranks of a 16-layer Llama,
# PP_BENCH_MICROBATCHES micro-batches of 2 x 256 tokens per step, modes interleaved over ROUNDS launches
# each (docs/benchmarks.md "Pipeline parallelism"), next to PyTorch's torch.distributed.pipelining on the
# same model as transformers' LlamaForCausalLM split into the same stages (benchmarks/torch_pp_bench.py, the
# torch of the project's Python environment, scripts/setup.sh): torch_gpipe, torch_1f1b, torch_interleaved
# (2 virtual stages per rank). NPROC=2 runs 2 stages (one rank per core on a 2-core machine), MODES picks
# modes, PP_BENCH_LAYERS / PP_BENCH_COSTS pass through to pp_bench, TORCH_ATTN=eager|sdpa (default sdpa)
# picks the PyTorch modes' attention.
set -euo pipefail
# shellcheck source=bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
build=${1:-build}
steps=${STEPS:-3}
rounds=${ROUNDS:-3}
nproc=${NPROC:-4}
attn=${TORCH_ATTN:-sdpa}
modes=${MODES:-fsdp4 pp4_gpipe pp4_1f1b pp4_interleaved pp4_zero_bubble torch_gpipe torch_1f1b torch_interleaved}
python=$("$(dirname "$0")/python_env.sh")/bin/python
bench_header
if ! "$python" -c "import torch, transformers" 2>/dev/null; then
  kept=""
  for mode in $modes; do
    case $mode in
      torch_*) echo "RESULT mode=$mode skipped (run scripts/setup.sh: the project's Python environment has no torch and transformers)" ;;
      *) kept="$kept $mode" ;;
    esac
  done
  modes=$kept
fi
for round in $(seq "$rounds"); do
  for mode in $modes; do
    case $mode in
      torch_*)
        "$build/hyperparallel" run --no-prefix --nproc-per-node "$nproc" -- "$python" benchmarks/torch_pp_bench.py "${mode#torch_}" "$steps" --attn "$attn" | grep RESULT ;;
      *)
        "$build/hyperparallel" run --no-prefix --nproc-per-node "$nproc" -- "$build/pp_bench" "$mode" "$steps" | grep -E 'RESULT|SIMULATED' | paste -sd ' ' ;;
    esac
  done
done
bench_footer
