// Attention with one QKV GEMM and no KV-head copies. See fused_attention.h.
#include "fused_attention.h"

#include "causal_attention.h"
#include "hyperparallel/platform/user_error.h"
#include "fused_rope.h"
#include "rotary.h"

namespace hyperparallel::models {

namespace {
constexpr int64_t kQueryBlock = 256;  // rows of queries per causal block

// Other dtypes: causal attention in query blocks with ATen's batched ops. Block [q0, q1) only
// needs keys [0, past + q1); the rest of its row is masked to zero weight.
at::Tensor blocked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& values, const at::Tensor& mask, double scaling,
                             int64_t groups) {
  const int64_t batch = q.size(0), kv_heads = q.size(1), seq = q.size(2) / groups;
  const int64_t past = k.size(2) - seq;  // cached keys before this call's tokens
  const int64_t block = seq >= 2 * kQueryBlock ? kQueryBlock : seq;
  std::vector<at::Tensor> outs;
  for (int64_t q0 = 0; q0 < seq; q0 += block) {
    const int64_t len = std::min(block, seq - q0), keys = past + q0 + len;
    const at::Tensor kc = k.narrow(2, 0, keys), vc = values.narrow(2, 0, keys);
    at::Tensor scores = at::matmul(q.narrow(2, q0 * groups, len * groups), kc.transpose(2, 3));  // [B, KV, len*G, keys]
    scores.mul_(scaling);
    if (mask.defined()) {
      scores.view({batch, kv_heads, len, groups, keys}).add_(mask.narrow(2, q0, len).narrow(3, 0, keys).view({batch, 1, len, 1, keys}));
    }
    const at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
    outs.push_back(at::matmul(probs, vc));  // [B, KV, len*G, D]
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 2);
}

}  // namespace

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
  const at::Tensor qkv = linear_with_kept_outputs(this, hidden, weight, bias);  // [B, T, (H + 2 KV) D]
  at::Tensor q = qkv.narrow(-1, 0, q_width).view({batch, seq, num_heads_, head_dim_});
  at::Tensor k = qkv.narrow(-1, q_width, kv_width).view({batch, seq, num_kv_heads_, head_dim_});
  const at::Tensor v = qkv.narrow(-1, q_width + kv_width, kv_width).view({batch, seq, num_kv_heads_, head_dim_}).transpose(1, 2).contiguous();
  if (q_norm_) {
    q = (*q_norm_)(q);
    k = (*k_norm_)(k);
  }
  if (in.shard) {  // context parallelism: the installed core attends across ranks
    return o_proj_->forward(in.core->attend(apply_rope(q.transpose(1, 2), in.cos, in.sin), apply_rope(k.transpose(1, 2), in.cos, in.sin),
                                            v, *in.shard, scaling_));
  }
  // The G query heads of KV head kv, position-major: rows t * G + g of one [T*G, D] operand.
  if (q.scalar_type() == at::kFloat && in.cos.scalar_type() == at::kFloat) {
    q = fused_rope(q, in.cos, in.sin, num_kv_heads_).view({batch, num_kv_heads_, seq * groups, head_dim_});
    k = fused_rope(k, in.cos, in.sin, num_kv_heads_).view({batch, num_kv_heads_, seq, head_dim_});
  } else {
    q = apply_rope(q.transpose(1, 2), in.cos, in.sin)
            .view({batch, num_kv_heads_, groups, seq, head_dim_})
            .transpose(2, 3)
            .reshape({batch, num_kv_heads_, seq * groups, head_dim_});
    k = apply_rope(k.transpose(1, 2), in.cos, in.sin);
  }
  at::Tensor values = v;
  if (in.cache) std::tie(k, values) = in.cache->append(in.layer, k, v);
  at::Tensor grouped;  // [B, KV, T*G, D]
  if (causal_attention_supports(q, in.mask)) {
    grouped = causal_attention(q, k, values, in.mask, scaling_);
  } else {
    grouped = blocked_attention(q, k, values, in.mask, scaling_, groups);
  }
  const at::Tensor out = grouped.view({batch, num_kv_heads_, seq, groups, head_dim_}).permute({0, 2, 1, 3, 4}).reshape({batch, seq, q_width});
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
