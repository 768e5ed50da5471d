// Eager attention, as transformers computes it. See attention.h.
#include "attention.h"

#include <cmath>
#include <vector>

#include "causal_attention.h"
#include "hyperparallel/platform/user_error.h"
#include "recompute.h"
#include "rotary.h"

namespace hyperparallel::models {

Attention::Attention(const ModelConfig& c, ParamFactory& factory)
    : AttentionModule(c.class_prefix() + "Attention"),
      num_heads(c.num_attention_heads),
      num_kv_heads(c.num_key_value_heads),
      head_dim(c.head_dim),
      scaling(1.0 / std::sqrt(static_cast<double>(c.head_dim))) {
  const bool qkv_bias = c.attention_bias;
  const bool o_bias = c.attention_bias && c.model_type == "llama";
  q_proj = register_module("q_proj", std::make_shared<Linear>(c.hidden_size, num_heads * head_dim, qkv_bias, factory));
  k_proj = register_module("k_proj", std::make_shared<Linear>(c.hidden_size, num_kv_heads * head_dim, qkv_bias, factory));
  v_proj = register_module("v_proj", std::make_shared<Linear>(c.hidden_size, num_kv_heads * head_dim, qkv_bias, factory));
  o_proj = register_module("o_proj", std::make_shared<Linear>(num_heads * head_dim, c.hidden_size, o_bias, factory));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", std::make_shared<RMSNorm>(c.class_prefix() + "RMSNorm", head_dim, c.rms_norm_eps, factory));
    k_norm = register_module("k_norm", std::make_shared<RMSNorm>(c.class_prefix() + "RMSNorm", head_dim, c.rms_norm_eps, factory));
  }
}

at::Tensor Attention::forward(const at::Tensor& hidden, const AttentionInputs& in) {
  const int64_t batch = hidden.size(0), seq = hidden.size(1);
  // Head counts come from the projections: under tensor parallelism they are this rank's heads.
  at::Tensor q = q_proj->forward(hidden).view({batch, seq, -1, head_dim});
  at::Tensor k = k_proj->forward(hidden).view({batch, seq, -1, head_dim});
  at::Tensor v = v_proj->forward(hidden).view({batch, seq, -1, head_dim}).transpose(1, 2);
  if (q_norm) {
    q = (*q_norm)(q);
    k = (*k_norm)(k);
  }
  q = apply_rope(q.transpose(1, 2), in.cos, in.sin);
  k = apply_rope(k.transpose(1, 2), in.cos, in.sin);
  if (in.cache) std::tie(k, v) = in.cache->append(in.layer, k, v);
  if (!recompute_core || in.cache) return o_proj->forward(attention_core(q, k, v, in, scaling));
  // One input for the recompute: q, k and v packed (the function keeps only this).
  const std::vector<int64_t> qs = q.sizes().vec(), ks = k.sizes().vec();
  const at::Tensor packed = at::cat({q.reshape({-1}), k.reshape({-1}), v.reshape({-1})});
  const AttentionInputs shared = in;  // by value: the core runs again in backward
  const double scale = scaling;
  const at::Tensor out = run_with_recompute(
      packed,
      [qs, ks, shared, scale](const at::Tensor& all, std::vector<at::Tensor>*) {
        const int64_t nq = qs[0] * qs[1] * qs[2] * qs[3], nk = ks[0] * ks[1] * ks[2] * ks[3];
        return attention_core(all.narrow(0, 0, nq).view(qs), all.narrow(0, nq, nk).view(ks), all.narrow(0, nq + nk, nk).view(ks),
                              shared, scale);
      },
      nullptr);
  return o_proj->forward(out);
}

at::Tensor attention_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionInputs& in, double scaling) {
  return in.shard ? in.core->attend(q, k, v, *in.shard, scaling) : attention_core(q, k, v, in.mask, scaling);
}

at::Tensor attention_core(const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v_in, const at::Tensor& mask, double scaling) {
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), head_dim = q.size(3);
  const int64_t kv_heads = k_in.size(1), keys = k_in.size(2);
  if (causal_attention_supports(q, mask)) {  // the same function, tiled (causal_attention.h)
    return causal_attention_heads(q, k_in, v_in, mask, scaling).view({batch, seq, heads * head_dim});
  }
  at::Tensor k = k_in, v = v_in;
  if (kv_heads != heads) {  // transformers' repeat_kv
    const int64_t groups = heads / kv_heads;
    k = k.unsqueeze(2).expand({batch, kv_heads, groups, keys, head_dim}).reshape({batch, heads, keys, head_dim});
    v = v.unsqueeze(2).expand({batch, kv_heads, groups, keys, head_dim}).reshape({batch, heads, keys, head_dim});
  }
  at::Tensor scores = at::matmul(q, k.transpose(2, 3)) * scaling;
  if (mask.defined()) scores = scores + mask;
  const at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  return at::matmul(probs, v).transpose(1, 2).reshape({batch, seq, heads * head_dim});
}

std::pair<at::Tensor, at::Tensor> KVCache::append(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  if (static_cast<int64_t>(keys.size()) <= layer) {
    keys.resize(layer + 1);
    values.resize(layer + 1);
  }
  keys[layer] = keys[layer].defined() ? at::cat({keys[layer], k}, 2) : k.contiguous();
  values[layer] = values[layer].defined() ? at::cat({values[layer], v}, 2) : v.contiguous();
  return {keys[layer], values[layer]};
}

std::shared_ptr<NormModule> replace_norm_child(torch::nn::Module& module, const std::string& name,
                                               std::shared_ptr<torch::nn::Module> replacement) {
  auto norm = std::dynamic_pointer_cast<NormModule>(replacement);
  if (!norm) throw UserError(module.name() + "." + name + " is a norm; the replacement " + replacement->name() + " is not");
  module.replace_module(name, norm);
  return norm;
}

void Attention::replace_child(const std::string& name, std::shared_ptr<torch::nn::Module> replacement) {
  if (name == "q_norm" && q_norm) {
    q_norm = replace_norm_child(*this, name, replacement);
  } else if (name == "k_norm" && k_norm) {
    k_norm = replace_norm_child(*this, name, replacement);
  } else {
    throw UserError(this->name() + " has no replaceable child '" + name + "' (replaceable: " +
                    (q_norm ? "q_norm, k_norm" : "none") + ")");
  }
}

}  // namespace hyperparallel::models
