// The causal LM head and loss. See models/causal_lm.h.
#include "hyperparallel/models/causal_lm.h"

#include "decoder.h"
#include "hyperparallel/fsdp/module_hooks.h"
#include "recompute.h"
#include "hyperparallel/platform/user_error.h"
#include "layers.h"
#include "moe.h"

namespace hyperparallel::models {

CausalLM::CausalLM(const ModelConfig& config, bool deferred_init, uint64_t seed, at::ScalarType dtype)
    : torch::nn::Module(config.architecture), config_(config) {
  ParamFactory factory(deferred_init, seed, config.initializer_range, dtype);
  model_ = register_module("model", std::make_shared<DecoderModel>(config, factory));
  if (!config.tie_word_embeddings) {
    lm_head_ = register_module("lm_head", std::make_shared<Linear>(config.hidden_size, config.vocab_size, false, factory));
  }
}

std::vector<torch::nn::Module*> CausalLM::decoder_layers() {
  std::vector<torch::nn::Module*> out;
  for (auto& layer : model_->decoder_layers) out.push_back(layer.get());
  return out;
}

namespace {

void check_input(const CausalLMInput& in, const ModelConfig& c) {
  if (!in.input_ids.defined() || in.input_ids.dim() != 2 || in.input_ids.scalar_type() != at::kLong) {
    throw UserError("CausalLM::forward: input_ids must be an int64 tensor [batch, seq]");
  }
  const auto shape = in.input_ids.sizes();
  for (const auto* t : {&in.position_ids, &in.labels}) {
    if (t->defined() && t->sizes() != shape) {
      throw UserError("CausalLM::forward: position_ids and labels must have the shape of input_ids");
    }
  }
  if (in.shard) {
    if (!in.position_ids.defined() || in.cache) {
      throw UserError("CausalLM::forward: a sequence shard needs position_ids (the tokens' positions in their rows) and no cache");
    }
    if (in.shard->index.numel() != shape[1]) {
      throw UserError("CausalLM::forward: the sequence shard lists " + std::to_string(in.shard->index.numel()) +
                      " token indices for " + std::to_string(shape[1]) + " tokens");
    }
  }
  const int64_t past = in.cache ? in.cache->length() : 0;
  if (in.attention_mask.defined() && (in.attention_mask.dim() != 2 || in.attention_mask.size(0) != shape[0] ||
                                      in.attention_mask.size(1) != past + shape[1])) {
    throw UserError("CausalLM::forward: attention_mask must be [batch, cached + new tokens] = [" + std::to_string(shape[0]) + ", " +
                    std::to_string(past + shape[1]) + "]");
  }
  if (in.input_ids.numel() > 0) {
    const int64_t lo = in.input_ids.min().item<int64_t>(), hi = in.input_ids.max().item<int64_t>();
    if (lo < 0 || hi >= c.vocab_size) {
      throw UserError("CausalLM::forward: token id " + std::to_string(lo < 0 ? lo : hi) + " is outside the vocabulary [0, " +
                      std::to_string(c.vocab_size) + ")");
    }
  }
}

}  // namespace

CausalLMOutput CausalLM::forward(const CausalLMInput& in) {
  check_input(in, config_);
  CausalLMOutput out;
  const bool want_router_logits = config_.num_experts > 0 && in.output_router_logits.value_or(config_.output_router_logits);
  std::vector<at::Tensor>* router_logits = want_router_logits ? &out.router_logits : nullptr;
  // Next-token prediction: position t predicts labels[t + 1]; the last position predicts nothing.
  at::Tensor shifted;
  if (in.shard && !attention_core_) {
    throw UserError("CausalLM::forward: the input is a sequence shard and the model has no attention core; "
                    "install one with cp::parallelize_context");
  }
  if (in.labels.defined() && in.shard) {
    shifted = in.labels.reshape({-1});  // next-token targets already
  } else if (in.labels.defined()) {
    const int64_t batch = in.labels.size(0), seq = in.labels.size(1);
    shifted = at::cat({in.labels.narrow(1, 1, seq - 1), at::full({batch, 1}, -100, in.labels.options())}, 1).reshape({-1});
  }
  const bool chunked = loss_chunk_tokens_ > 0 && shifted.defined();
  const at::Tensor result = fsdp::hooked_forward(*this, [&] {
    const at::Tensor hidden = model_->forward(in.input_ids, in.attention_mask, in.position_ids, in.document_mask, router_logits, in.cache,
                                             in.shard, in.shard ? attention_core_ : nullptr);
    return chunked ? chunked_loss_sum(hidden, shifted) : head(hidden);
  });
  if (!shifted.defined()) {
    out.logits = token_loss_ ? token_loss_->full_logits(result) : result;
    return out;
  }
  if (chunked) {
    out.lm_loss_sum = result;
  } else {
    out.logits = result;
    const at::Tensor flat_logits = result.reshape({shifted.size(0), -1});
    out.lm_loss_sum = token_loss_ ? token_loss_->sum(flat_logits, shifted)
                                  : at::cross_entropy_loss(flat_logits, shifted, {}, at::Reduction::Sum, -100);
  }
  out.label_tokens = shifted.ne(-100).sum().item<int64_t>();
  out.lm_loss = out.lm_loss_sum / static_cast<double>(std::max<int64_t>(out.label_tokens, 1));
  out.loss = out.lm_loss;
  if (want_router_logits && !out.router_logits.empty()) {
    out.aux_loss = load_balancing_loss(out.router_logits, config_.num_experts, config_.num_experts_per_tok, in.attention_mask);
    out.loss = out.lm_loss + config_.router_aux_loss_coef * out.aux_loss;
  }
  return out;
}

// The head runs through its forward hooks (a column-parallel head under loss parallel).
at::Tensor CausalLM::head(const at::Tensor& hidden) {
  const at::Tensor logits = lm_head_ ? lm_head_->forward(hidden) : at::linear(hidden, model_->embed_tokens->weight);
  return logits.to(at::kFloat);
}

void CausalLM::set_loss_chunk_tokens(int64_t tokens) {
  if (tokens < 0) throw UserError("chunked loss: chunk of " + std::to_string(tokens) + " tokens; use a count >= 1, or 0 for off");
  loss_chunk_tokens_ = tokens;
}

at::Tensor CausalLM::chunked_loss_sum(const at::Tensor& hidden, const at::Tensor& shifted_labels) {
  const at::Tensor rows = hidden.reshape({-1, hidden.size(-1)});
  if (rows.size(0) != shifted_labels.size(0)) {
    throw UserError("chunked loss needs the whole sequence on every rank; with sequence_parallel and loss_parallel the head's "
                    "input is sequence-sharded: turn chunked_loss off or one of them");
  }
  // The head's parameters leave through each chunk (run_with_recompute's `params`): every
  // chunk reads them, and a tied head is the embedding too.
  std::vector<at::Tensor> head_params;
  for (const auto& p : lm_head_ ? lm_head_->parameters() : std::vector<at::Tensor>{model_->embed_tokens->weight}) {
    if (p.requires_grad()) head_params.push_back(p);
  }
  at::Tensor sum = at::zeros({}, at::kFloat);
  for (int64_t start = 0; start < rows.size(0); start += loss_chunk_tokens_) {
    const int64_t n = std::min(loss_chunk_tokens_, rows.size(0) - start);
    const at::Tensor labels = shifted_labels.narrow(0, start, n);
    sum = sum + run_with_recompute(
                    rows.narrow(0, start, n),
                    [this, labels](const at::Tensor& chunk, std::vector<at::Tensor>*) {
                      const at::Tensor logits = head(chunk);
                      return token_loss_ ? token_loss_->sum(logits, labels)
                                         : at::cross_entropy_loss(logits, labels, {}, at::Reduction::Sum, -100);
                    },
                    nullptr, head_params);
  }
  return sum;
}

}  // namespace hyperparallel::models
