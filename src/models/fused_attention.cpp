// Attention with one QKV GEMM and no KV-head copies. See fused_attention.h.
#include "fused_attention.h"

#include "hyperparallel/platform/user_error.h"
#include "rotary.h"

namespace hyperparallel::models {

FusedQKVAttention::FusedQKVAttention(Attention& original)
    : AttentionModule("FusedQKVAttention"),
      num_heads_(original.num_heads),
      num_kv_heads_(original.num_kv_heads),
      head_dim_(original.head_dim),
      scaling_(original.scaling) {
  q_proj_ = register_module("q_proj", original.q_proj);
  k_proj_ = register_module("k_proj", original.k_proj);
  v_proj_ = register_module("v_proj", original.v_proj);
  o_proj_ = register_module("o_proj", original.o_proj);
  if (original.q_norm) {
    q_norm_ = register_module("q_norm", original.q_norm);
    k_norm_ = register_module("k_norm", original.k_norm);
  }
}

at::Tensor FusedQKVAttention::forward(const at::Tensor& hidden, const AttentionInputs& in) {
  const int64_t batch = hidden.size(0), seq = hidden.size(1);
  const int64_t groups = num_heads_ / num_kv_heads_;
  const int64_t q_width = num_heads_ * head_dim_, kv_width = num_kv_heads_ * head_dim_;
  const at::Tensor weight = at::cat({q_proj_->weight, k_proj_->weight, v_proj_->weight}, 0);
  const at::Tensor bias = q_proj_->bias.defined() ? at::cat({q_proj_->bias, k_proj_->bias, v_proj_->bias}, 0) : at::Tensor();
  const at::Tensor qkv = at::linear(hidden, weight, bias);  // [B, T, (H + 2 KV) D]
  at::Tensor q = qkv.narrow(-1, 0, q_width).view({batch, seq, num_heads_, head_dim_});
  at::Tensor k = qkv.narrow(-1, q_width, kv_width).view({batch, seq, num_kv_heads_, head_dim_});
  const at::Tensor v = qkv.narrow(-1, q_width + kv_width, kv_width).view({batch, seq, num_kv_heads_, head_dim_}).transpose(1, 2);
  if (q_norm_) {
    q = q_norm_->forward(q);
    k = k_norm_->forward(k);
  }
  // Query heads kv*G + g of KV head kv, as [B, KV, G, T, D]; rope broadcast over both head dims.
  q = q.view({batch, seq, num_kv_heads_, groups, head_dim_}).permute({0, 2, 3, 1, 4});
  const at::Tensor cos = in.cos.view({batch, 1, 1, seq, head_dim_}), sin = in.sin.view({batch, 1, 1, seq, head_dim_});
  const int64_t half = head_dim_ / 2;
  auto rope = [&](const at::Tensor& x, const at::Tensor& c, const at::Tensor& s) {
    return x * c + at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1) * s;
  };
  q = rope(q, cos, sin).reshape({batch, num_kv_heads_, groups * seq, head_dim_});
  k = rope(k.transpose(1, 2), in.cos.unsqueeze(1), in.sin.unsqueeze(1));  // [B, KV, T, D]
  at::Tensor scores = at::matmul(q, k.transpose(2, 3));                  // [B, KV, G*T, T]
  scores.mul_(scaling_);
  if (in.mask.defined()) scores.view({batch, num_kv_heads_, groups, seq, seq}).add_(in.mask.unsqueeze(2));
  const at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  const at::Tensor out = at::matmul(probs, v)  // [B, KV, G*T, D]
                             .view({batch, num_kv_heads_, groups, seq, head_dim_})
                             .permute({0, 3, 1, 2, 4})
                             .reshape({batch, seq, q_width});
  return o_proj_->forward(out);
}

void FusedQKVAttention::replace_child(const std::string& name, std::shared_ptr<torch::nn::Module> replacement) {
  if (name == "q_norm" && q_norm_) {
    q_norm_ = replace_norm_child(*this, name, replacement);
  } else if (name == "k_norm" && k_norm_) {
    k_norm_ = replace_norm_child(*this, name, replacement);
  } else {
    throw UserError(this->name() + " has no replaceable child '" + name + "' (replaceable: " +
                    (q_norm_ ? "q_norm, k_norm" : "none") + ")");
  }
}

std::shared_ptr<torch::nn::Module> make_fused_qkv_attention(torch::nn::Module& original, const ModelConfig&) {
  auto* attention = dynamic_cast<Attention*>(&original);
  if (!attention) throw UserError("fused_qkv_attention replaces attention modules (e.g. Qwen3Attention), not " + original.name());
  return std::make_shared<FusedQKVAttention>(*attention);
}

}  // namespace hyperparallel::models
