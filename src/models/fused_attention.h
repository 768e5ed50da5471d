// FusedQKVAttention: the same function as Attention with less memory traffic.
//  - q, k and v come from one GEMM over the concatenated projection weights;
//  - rotary embedding and the head transpose are one pass (fused_rope.h);
//  - grouped KV heads are not repeated: the G query heads of one KV head form one
//    [G*T, head_dim] operand of a single batched GEMM against that KV head;
//  - the core: in fp32 and bf16, the tiled kernel the eager path runs too (causal_attention.h);
//    in other dtypes (fp16, fp64), scores scaled and masked in place in causal blocks of 256
//    query positions that see only the keys up to their block's end. There a query row with no visible key
//    (left padding) gets uniform weight over the keys of its block instead of the whole row —
//    such rows are padding and never compared or trained on.
// The attention mask must be causal (every model here is).
// It adopts the original's children (q_proj ... o_proj, q_norm, k_norm: same tensors, same
// names). Results equal the eager attention's to float rounding (tests: within 1e-6).
#pragma once

#include <memory>
#include <string>

#include "attention.h"

namespace hyperparallel::models {

class FusedQKVAttention : public AttentionModule, public ModuleSlots {
 public:
  explicit FusedQKVAttention(Attention& original);
  at::Tensor forward(const at::Tensor& hidden, const AttentionInputs& inputs) override;
  void replace_child(const std::string& name, std::shared_ptr<torch::nn::Module> replacement) override;

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
  double scaling_;
  std::shared_ptr<Linear> q_proj_, k_proj_, v_proj_, o_proj_;
  std::shared_ptr<NormModule> q_norm_, k_norm_;
};

// plan_overrides factory: replaces any Attention (UserError for other module types).
std::shared_ptr<torch::nn::Module> make_fused_qkv_attention(torch::nn::Module& original, const ModelConfig& config);

}  // namespace hyperparallel::models
