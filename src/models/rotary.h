// Rotary position embeddings as transformers computes them: the inverse frequencies (with
// "linear" or "llama3" scaling), cos/sin tables for given positions, and their application
// to q and k (rotate-half convention). Every step uses the same fp32 operations as the
// reference so results match to the last bits where the math allows.
#pragma once

#include <ATen/ATen.h>

#include <utility>

#include "hyperparallel/models/model_config.h"

namespace hyperparallel::models {

at::Tensor rope_inv_freq(const ModelConfig& config);  // [head_dim / 2], fp32
// cos and sin [B, T, head_dim] for position_ids [B, T], cast to `dtype`.
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, const at::Tensor& position_ids, at::ScalarType dtype);
// x [B, heads, T, head_dim]; cos/sin [B, T, head_dim].
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace hyperparallel::models
