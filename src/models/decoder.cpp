// The decoder body. See decoder.h.
#include "decoder.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "activation_swap.h"
#include "attention.h"
#include "hyperparallel/fsdp/module_hooks.h"
#include "hyperparallel/platform/user_error.h"
#include "linear_outputs.h"
#include "moe.h"
#include "recompute.h"
#include "rotary.h"

namespace hyperparallel::models {

DecoderLayer::DecoderLayer(const ModelConfig& c, int64_t index, ParamFactory& factory)
    : torch::nn::Module(c.class_prefix() + "DecoderLayer"), index_(index) {
  const std::string norm_type = c.class_prefix() + "RMSNorm";
  // Registration order follows HF's attribute order, so named_parameters() lists the same.
  self_attn = register_module("self_attn", std::shared_ptr<AttentionModule>(std::make_shared<Attention>(c, factory)));
  if (c.is_moe_layer(index)) {
    mlp = register_module("mlp", std::shared_ptr<FeedForwardModule>(std::make_shared<SparseMoeBlock>(c, factory)));
  } else {
    mlp = register_module("mlp", std::shared_ptr<FeedForwardModule>(std::make_shared<Mlp>(
                                     c.class_prefix() + "MLP", c.hidden_size, c.intermediate_size, c.mlp_bias, factory)));
  }
  input_layernorm = register_module("input_layernorm", std::shared_ptr<NormModule>(std::make_shared<RMSNorm>(
                                                           norm_type, c.hidden_size, c.rms_norm_eps, factory)));
  post_attention_layernorm = register_module(
      "post_attention_layernorm",
      std::shared_ptr<NormModule>(std::make_shared<RMSNorm>(norm_type, c.hidden_size, c.rms_norm_eps, factory)));
}

at::Tensor DecoderLayer::forward(const at::Tensor& hidden, const AttentionInputs& inputs, std::vector<at::Tensor>* router_logits) {
  return fsdp::hooked_forward(*this, hidden, [&](const at::Tensor& x) {
    if (!recompute || inputs.cache) return body(x, inputs, router_logits);
    const AttentionInputs shared = inputs;  // by value: the segment runs again in backward
    // Keeping Linear outputs pays only when the recompute will run: not in a forward without a graph.
    const auto kept = keep_linear_outputs && at::GradMode::is_enabled() && x.requires_grad()
                          ? std::make_shared<KeptLinearOutputs>()  // filled by the forward, emptied by the recompute
                          : nullptr;
    return run_with_recompute(
        x,
        [this, shared, kept](const at::Tensor& in, std::vector<at::Tensor>* logits) {
          std::optional<LinearOutputScope> scope;
          if (kept) scope.emplace(*kept, recomputing() ? LinearOutputScope::Mode::kReplay : LinearOutputScope::Mode::kRecord);
          return body(in, shared, logits);
        },
        router_logits, {}, swap);
  });
}

at::Tensor DecoderLayer::body(const at::Tensor& x, const AttentionInputs& inputs, std::vector<at::Tensor>* router_logits) {
  const at::Tensor h = x + (*self_attn)((*input_layernorm)(x), inputs);
  return h + (*mlp)((*post_attention_layernorm)(h), router_logits);
}

void DecoderLayer::replace_child(const std::string& name, std::shared_ptr<torch::nn::Module> replacement) {
  if (name == "input_layernorm") {
    input_layernorm = replace_norm_child(*this, name, replacement);
  } else if (name == "post_attention_layernorm") {
    post_attention_layernorm = replace_norm_child(*this, name, replacement);
  } else if (name == "self_attn") {
    auto attn = std::dynamic_pointer_cast<AttentionModule>(replacement);
    if (!attn) throw UserError(this->name() + ".self_attn is an attention; the replacement " + replacement->name() + " is not");
    self_attn = replace_module(name, attn);
  } else if (name == "mlp") {
    auto ff = std::dynamic_pointer_cast<FeedForwardModule>(replacement);
    if (!ff) throw UserError(this->name() + ".mlp is a feed-forward block; the replacement " + replacement->name() + " is not");
    mlp = replace_module(name, ff);
  } else {
    throw UserError(this->name() + " has no replaceable child '" + name +
                    "' (replaceable: self_attn, mlp, input_layernorm, post_attention_layernorm)");
  }
}

DecoderModel::DecoderModel(const ModelConfig& c, ParamFactory& factory) : torch::nn::Module(c.class_prefix() + "Model") {
  embed_tokens = register_module("embed_tokens", std::make_shared<Embedding>(c.vocab_size, c.hidden_size, factory));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    decoder_layers.push_back(std::make_shared<DecoderLayer>(c, i, factory));
    layers->push_back(decoder_layers.back());
  }
  norm = register_module("norm", std::shared_ptr<NormModule>(std::make_shared<RMSNorm>(c.class_prefix() + "RMSNorm", c.hidden_size,
                                                                                     c.rms_norm_eps, factory)));
  inv_freq_ = rope_inv_freq(c);
  num_layers_ = c.num_hidden_layers;
}

std::shared_ptr<DecoderLayer> DecoderModel::held_layer(int64_t index) const {
  for (const auto& layer : decoder_layers) {
    if (layer->index() == index) return layer;
  }
  throw UserError(name() + " does not hold layer " + std::to_string(index));
}

bool DecoderModel::holds_all() const {
  return embed_tokens && norm && static_cast<int64_t>(decoder_layers.size()) == num_layers_;
}

void DecoderModel::replace_child(const std::string& name, std::shared_ptr<torch::nn::Module> replacement) {
  if (name != "norm") throw UserError(this->name() + " has no replaceable child '" + name + "' (replaceable: norm)");
  norm = replace_norm_child(*this, name, replacement);
}

at::Tensor build_attention_mask(int64_t batch, int64_t seq, const at::Tensor& attention_mask, const at::Tensor& position_ids,
                                bool document_mask, at::ScalarType dtype, int64_t past) {
  const int64_t keys = past + seq;
  at::Tensor allowed = at::ones({seq, keys}, at::kBool).tril(past).view({1, 1, seq, keys}).expand({batch, 1, seq, keys});
  if (attention_mask.defined()) allowed = allowed.logical_and(attention_mask.to(at::kBool).view({batch, 1, 1, keys}));
  if (document_mask && position_ids.defined() && past == 0) {
    const at::Tensor doc = position_ids.eq(0).cumsum(1);  // [B, T]
    allowed = allowed.logical_and(doc.view({batch, 1, seq, 1}).eq(doc.view({batch, 1, 1, seq})));
  }
  return at::zeros({batch, 1, seq, keys}, at::TensorOptions().dtype(dtype)).masked_fill(allowed.logical_not(), masked_score(dtype));
}

double masked_score(at::ScalarType dtype) {
  return dtype == at::kDouble     ? std::numeric_limits<double>::lowest()
         : dtype == at::kBFloat16 ? -3.38953138925153547590470800371487866880e+38
         : dtype == at::kHalf     ? -65504.0
                                  : static_cast<double>(std::numeric_limits<float>::lowest());
}

AttentionInputs DecoderModel::attention_inputs(int64_t batch, int64_t seq, at::ScalarType dtype, const at::Tensor& attention_mask,
                                               const at::Tensor& position_ids_in, bool document_mask, KVCache* cache,
                                               std::shared_ptr<const SequenceShard> shard, std::shared_ptr<AttentionCore> core) const {
  const int64_t past = cache ? cache->length() : 0;
  const at::Tensor position_ids =
      position_ids_in.defined() ? position_ids_in : at::arange(past, past + seq, at::kLong).view({1, seq}).expand({batch, seq});
  AttentionInputs inputs;
  std::tie(inputs.cos, inputs.sin) = rope_cos_sin(inv_freq_, position_ids, dtype);
  if (shard) {
    inputs.shard = std::move(shard);
    inputs.core = std::move(core);
  } else {
    inputs.mask = build_attention_mask(batch, seq, attention_mask, position_ids_in, document_mask, dtype, past);
  }
  inputs.cache = cache;
  return inputs;
}

at::Tensor DecoderModel::run_layers(at::Tensor hidden, AttentionInputs inputs, int64_t begin, int64_t end,
                                    std::vector<at::Tensor>* router_logits, std::vector<at::Tensor>* layer_outputs) {
  int64_t next = begin;
  for (const auto& layer : decoder_layers) {
    if (layer->index() < begin || layer->index() >= end) continue;
    if (layer->index() != next) break;
    inputs.layer = layer->index();
    hidden = layer->forward(hidden, inputs, router_logits);
    if (layer_outputs) layer_outputs->push_back(hidden);
    ++next;
  }
  if (next != end) {
    throw UserError(name() + ": layers [" + std::to_string(begin) + ", " + std::to_string(end) + ") are not all held here (layer " +
                    std::to_string(next) + " is missing)");
  }
  return hidden;
}

void DecoderModel::keep_only(bool embedding, const std::vector<int64_t>& layer_indices, bool final_norm) {
  if (!embedding && embed_tokens) {
    unregister_module("embed_tokens");
    embed_tokens = nullptr;
  }
  if (!final_norm && norm) {
    unregister_module("norm");
    norm = nullptr;
  }
  std::vector<std::shared_ptr<DecoderLayer>> kept;
  for (const auto& layer : decoder_layers) {
    if (std::find(layer_indices.begin(), layer_indices.end(), layer->index()) != layer_indices.end()) {
      kept.push_back(layer);
    } else {
      layers->unregister_module(std::to_string(layer->index()));
    }
  }
  decoder_layers = std::move(kept);
}

at::Tensor DecoderModel::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask, const at::Tensor& position_ids,
                                 bool document_mask, std::vector<at::Tensor>* router_logits, KVCache* cache,
                                 std::shared_ptr<const SequenceShard> shard, std::shared_ptr<AttentionCore> core) {
  if (!holds_all()) {
    throw UserError(name() + " holds only part of the model (a pipeline stage); run it through the stage's forward");
  }
  const int64_t batch = input_ids.size(0), seq = input_ids.size(1);
  at::Tensor hidden = embed_tokens->forward(input_ids);
  AttentionInputs inputs = attention_inputs(batch, seq, hidden.scalar_type(), attention_mask, position_ids, document_mask, cache,
                                            std::move(shard), std::move(core));
  hidden = run_layers(hidden, std::move(inputs), 0, num_layers_, router_logits);
  return (*norm)(hidden);
}

}  // namespace hyperparallel::models
