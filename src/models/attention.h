// Attention: multi-head attention with grouped KV heads, rotary embeddings, optional q/k/v
// biases (Qwen2, Llama's attention_bias) and optional per-head RMSNorm of q and k (Qwen3),
// computed as transformers' eager attention does: scores = q k^T * head_dim^-0.5 + mask,
// softmax in fp32, times v. Its children keep HF's names (q_proj, k_proj, v_proj, o_proj,
// q_norm, k_norm) so a replacement (plan_overrides) can adopt them.
#pragma once

#include <memory>
#include <string>

#include "hyperparallel/models/model_config.h"
#include "hyperparallel/models/module_interfaces.h"
#include "layers.h"

namespace hyperparallel::models {

class Attention : public AttentionModule, public ModuleSlots {
 public:
  Attention(const ModelConfig& config, ParamFactory& factory);
  at::Tensor forward(const at::Tensor& hidden, const AttentionInputs& inputs) override;
  void replace_child(const std::string& name, std::shared_ptr<torch::nn::Module> replacement) override;

  int64_t num_heads, num_kv_heads, head_dim;
  double scaling;
  // Selective activation checkpointing: the core (scores, mask, softmax, weighted values) keeps
  // only q, k and v and runs again in backward, so the [heads x T x T] scores and
  // probabilities are never kept (models/activation_checkpoint.h).
  bool recompute_core = false;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  std::shared_ptr<NormModule> q_norm, k_norm;  // null unless config.qk_norm
};

// The attention core on rotated q [B, H, T, D] and k, v [B, H_kv, K, D]: grouped kv heads
// repeated, scores scaled and masked, softmax in fp32, times v; returns [B, T, H * D]. The mask
// is the decoder's causal [B or 1, 1, T, K]; in fp32 the core runs as the tiled kernel
// (causal_attention.h), which relies on that causal structure.
at::Tensor attention_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scaling);
// The same with the forward's inputs: through inputs.core for a sequence shard, else with inputs.mask.
at::Tensor attention_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionInputs& inputs, double scaling);

// Replaces the norm child `name` of `module` (q_norm, input_layernorm, ...) and returns the
// new pointer for the owner's member; shared by every ModuleSlots implementation.
std::shared_ptr<NormModule> replace_norm_child(torch::nn::Module& module, const std::string& name,
                                               std::shared_ptr<torch::nn::Module> replacement);

}  // namespace hyperparallel::models
