#!/usr/bin/env bash
# TP4 vs FSDP4 vs FSDP2 x TP2 (and TP4 in Validation mode) on 4 ranks, a ~48 M Qwen3, modes interleaved over ROUNDS
# launches each (docs/benchmarks.md "Tensor parallelism"), next to PyTorch's on the same model as transformers'
# Qwen3ForCausalLM (benchmarks/torch_tp_bench.py, the torch of the project's Python environment, scripts/setup.sh):
#   dtensor_tp_sp  torch.distributed.tensor.parallel, torchtitan's plan: TP4 + sequence + loss parallel (tp4's peer)
#   dtensor_tp     the same without sequence parallelism
#   hf_tp_auto     transformers' own from_pretrained(tp_plan="auto"): TP4, no sequence parallelism, gathered logits
# MODES picks modes; TORCH_ATTN=eager|sdpa (default sdpa) picks the PyTorch modes' attention.
set -euo pipefail
# shellcheck source=bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
build=${1:-build}
steps=${STEPS:-4}
rounds=${ROUNDS:-2}
attn=${TORCH_ATTN:-sdpa}
modes=${MODES:-fsdp4 tp4 fsdp2_tp2 tp4_validate dtensor_tp_sp dtensor_tp hf_tp_auto}
python=$("$(dirname "$0")/python_env.sh")/bin/python
bench_header
if ! "$python" -c "import torch, transformers" 2>/dev/null; then
  kept=""
  for mode in $modes; do
    case $mode in
      dtensor_tp_sp | dtensor_tp | hf_tp_auto)
        echo "RESULT mode=$mode skipped (run scripts/setup.sh: the project's Python environment has no torch and transformers)" ;;
      *) kept="$kept $mode" ;;
    esac
  done
  modes=$kept
fi
for round in $(seq "$rounds"); do
  for mode in $modes; do
    case $mode in
      dtensor_tp_sp | dtensor_tp | hf_tp_auto)
        "$build/hyperparallel" run --no-prefix --nproc-per-node 4 -- "$python" benchmarks/torch_tp_bench.py "$mode" "$steps" --attn "$attn" | grep RESULT ;;
      *)
        "$build/hyperparallel" run --no-prefix --nproc-per-node 4 -- "$build/tp_bench" "$mode" "$steps" | grep RESULT ;;
    esac
  done
done
bench_footer
