// The tensor-parallel plans shipped for the HF decoder families (Llama, Qwen2, Qwen3, and the
// dense parts of Qwen3-MoE: its sparse blocks run whole on every tp rank), as
// Megatron splits a transformer block: attention heads and MLP features column-parallel,
// o_proj and down_proj row-parallel, one all-reduce per block forward and one backward; the
// embedding vocab-parallel (kept whole when tied to the head); with sequence parallelism the
// residual stream and the norms are sharded over the sequence and each block all-gathers
// its input and reduce-scatters its output. Qwen3's per-head q/k norms run on local heads.
// GQA with tp > kv heads keeps the k/v projections whole (ReplicatedKvHeads). The head
// (lm_head) stays replicated unless loss_parallel shards it over the vocabulary. docs/tp.md
// has the tables.
#pragma once

#include <cstdint>

#include "hyperparallel/models/model_config.h"
#include "hyperparallel/tp/parallelize_module.h"

namespace hyperparallel::tp {

struct TensorParallelOptions {
  bool sequence_parallel = false;
  // The head column-parallel (tied: the vocab-parallel embedding's rows) and its logits left
  // sharded for tp::enable_loss_parallel's cross-entropy.
  bool loss_parallel = false;
};

// Throws UserError with the numbers and the valid degrees when `tp_size` does not fit the
// model (heads not divisible, kv heads neither divisible nor a divisor of tp).
ParallelizePlan plan_for(const models::ModelConfig& config, int64_t tp_size, const TensorParallelOptions& options = {});

}  // namespace hyperparallel::tp
