// The slots of a decoder model that plan_overrides can fill with another implementation.
//
// A model is a tree of torch::nn::Modules named as in Hugging Face
// (model.layers.0.self_attn.q_proj). Three kinds of node have interchangeable
// implementations, each behind an interface here: a norm (NormModule), an attention
// (AttentionModule) and a feed-forward block (FeedForwardModule). A module that holds such
// children implements ModuleSlots so a replacement can be put in its place by name; the
// replacement must be of the same interface and keeps the parameter names and shapes (it
// usually adopts the original's parameter tensors), so checkpoints load unchanged.
// Each module's torch::nn::Module::name() is its HF class name (Qwen3Attention,
// LlamaRMSNorm, ...), which plan_overrides' module_type matches.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "hyperparallel/nn/forward_hooks.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hyperparallel::models {

// Callers run a block as (*block)(x, ...): that goes through the block's forward hooks
// (nn/forward_hooks.h), then the virtual forward an implementation overrides.
class NormModule : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  at::Tensor operator()(const at::Tensor& x) {
    return nn::run_with_hooks(*this, x, [this](const at::Tensor& in) { return forward(in); });
  }
};

// Keys and values of the tokens seen so far, per layer, for incremental decoding: an
// attention appends its new keys (after rotary) and values and attends over all of them.
struct KVCache {
  std::vector<at::Tensor> keys, values;  // per layer [B, kv_heads, T_past, head_dim]
  int64_t length() const { return keys.empty() || !keys[0].defined() ? 0 : keys[0].size(2); }
  // Stores this layer's new keys/values after the cached ones and returns all of them.
  std::pair<at::Tensor, at::Tensor> append(int64_t layer, const at::Tensor& k, const at::Tensor& v);
};

// A forward that holds only some tokens of each row (context parallelism, cp/): where its
// tokens sit in the full rows, and what a mask needs to know of the full rows. A query at
// full-row index i may see the key at j when j <= i, the key is valid and both are in the
// same document; attention then goes through an AttentionCore, which builds such masks block
// by block (nothing [L x L] on one rank).
struct SequenceShard {
  at::Tensor index;      // [T] int64: this forward's tokens' indices in the full rows (same for every row)
  at::Tensor documents;  // [B, L] int64 document id per full-row token; undefined: one document per row
  at::Tensor valid;      // [B, L] bool, false for padding; undefined: every token valid
  int64_t full_length = 0;  // L
};

// Attention over a sequence that is spread over several ranks: q [B, H, T, D] and k, v
// [B, H_kv, T, D] (after rotary) of this forward's tokens; returns [B, T, H * D] as
// attention_core does. Installed on the model from outside (CausalLM::set_attention_core).
class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  virtual at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const SequenceShard& shard,
                            double scaling) = 0;
};

// What every attention layer of one forward shares.
struct AttentionInputs {
  at::Tensor cos, sin;  // rotary tables [B, T, head_dim] in the compute dtype
  at::Tensor mask;      // additive [B, 1, T, T_past + T]: 0 where a query may attend, dtype min elsewhere
  KVCache* cache = nullptr;  // incremental decoding: append to and attend over this
  int64_t layer = 0;         // this layer's index into the cache
  // A sequence shard: no dense mask; attention goes through `core` (both set together).
  std::shared_ptr<const SequenceShard> shard;
  std::shared_ptr<AttentionCore> core;
};

class AttentionModule : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;
  virtual at::Tensor forward(const at::Tensor& hidden, const AttentionInputs& inputs) = 0;
  at::Tensor operator()(const at::Tensor& hidden, const AttentionInputs& inputs) {
    return nn::run_with_hooks(*this, hidden, [&](const at::Tensor& in) { return forward(in, inputs); });
  }
};

class FeedForwardModule : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;
  // A sparse block appends its router logits [tokens, experts] to `router_logits` when given.
  virtual at::Tensor forward(const at::Tensor& x, std::vector<at::Tensor>* router_logits) = 0;
  at::Tensor operator()(const at::Tensor& x, std::vector<at::Tensor>* router_logits) {
    return nn::run_with_hooks(*this, x, [&](const at::Tensor& in) { return forward(in, router_logits); });
  }
};

class ModuleSlots {
 public:
  virtual ~ModuleSlots() = default;
  // Puts `replacement` in the child slot `name`; throws UserError if the slot does not exist
  // or the replacement is not of the slot's interface.
  virtual void replace_child(const std::string& name, std::shared_ptr<torch::nn::Module> replacement) = 0;
};

}  // namespace hyperparallel::models
