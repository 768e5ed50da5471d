// linear_cross_entropy_sum: the head and the language-model loss together, chunk by chunk, with
// no recompute — Σ over labels ≠ -100 of −log softmax(hidden · weightᵀ)[label], the value of
// cross_entropy_sum(at::linear(hidden, weight), labels).
//
// The chunked loss's first form (CausalLM::chunked_loss_sum through run_with_recompute) keeps
// no [tokens × vocab] logits but computes each chunk's logits twice, once in forward and again
// in backward: one more head GEMM per chunk, a quarter of a step's FLOPs for a small model with
// a large vocabulary. Here the forward does each chunk's whole work at once, as Liger-Kernel's
// fused linear cross-entropy does: logits (one GEMM), their log-sum-exp, the loss, and at once
// their gradient softmax − one-hot written over the logits, then the chunk's share of the
// gradients — of the hidden rows (dlogits · weight) and of the weight (dlogitsᵀ · rows, summed
// over chunks in fp32). The backward only scales both by the incoming gradient. Three head
// GEMMs in all, as without chunking; memory: one chunk's logits, the [tokens × hidden]
// gradient and one [vocab × hidden] fp32 gradient, which the weight gets anyway.
//
// The weight's gradient is returned once for all chunks, so a tied head (the embedding matrix)
// and fully_shard's gradient hooks see one accumulation. fp32 and bf16 (the logits' gradient
// rounded to bf16 once, as cross_entropy_sum's backward does); CPU tensors.
#pragma once

#include <ATen/core/Tensor.h>

namespace hyperparallel::models {

// hidden [N, H], weight [V, H] (same dtype, fp32 or bf16), labels [N] int64; chunk >= 1 rows.
// Returns a 0-dim fp32 tensor; UserError for other inputs.
at::Tensor linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels, int64_t chunk);

}  // namespace hyperparallel::models
