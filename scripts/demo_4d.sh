#!/usr/bin/env bash
# The flagship job from HyperParallel's own YAML (examples/hp_qwen3_moe_4d.yaml): 8 local ranks as
# TP 2 x CP 2 (Ulysses) x EP 2 + FSDP 2, then the same job in one process, and every step's loss
# of the two side by side (docs/hyperparallel-yaml.md). STEPS (default 10) steps each.
set -euo pipefail
build=${1:-build}
steps=${STEPS:-10}
out=${OUT:-output/hp_qwen3_moe_4d}
"$build/hyperparallel" train examples/hp_qwen3_moe_4d.yaml --nproc_per_node=8 "--training.train_iters=$steps" "--checkpoint.checkpoint_dir=$out" \
  --checkpoint.save_ckpt=false --logging_steps=1
"$build/hyperparallel" train examples/hp_qwen3_moe_4d.yaml "--training.train_iters=$steps" "--checkpoint.checkpoint_dir=$out.one_process" \
  --checkpoint.save_ckpt=false --nproc_per_node=1 --training.micro_batch_size=8 --accelerator.tp_size=1 --accelerator.cp_size=1 \
  --accelerator.ep_size=1 --accelerator.sequence_parallel=false --accelerator.loss_parallel=false \
  --fsdp_config.dp_shard_size=-1 --fsdp_config.edp_shard_size=-1 --logging_steps=1
losses() { grep -o '"loss":[^,}]*' "$1/trainer_log.jsonl" | cut -d: -f2; }
echo
echo "step  8 ranks (tp2 x cp2 x ep2 x fsdp2)  1 process            relative difference"
paste <(losses "$out") <(losses "$out.one_process") | awk '{ d = $1 - $2; if (d < 0) d = -d; printf "%4d  %-34.10f %-20.10f %.2e\n", NR, $1, $2, d / $2 }'
