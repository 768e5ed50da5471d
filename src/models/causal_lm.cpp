// The causal LM head and loss. See models/causal_lm.h.
#include "hyperparallel/models/causal_lm.h"

#include "cpu_gemm.h"
#include "cross_entropy.h"
#include "linear_cross_entropy.h"
#include "decoder.h"
#include "hyperparallel/fsdp/module_hooks.h"
#include "hyperparallel/nn/forward_hooks.h"
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

namespace {

// Next-token prediction: position t predicts labels[t + 1]; the last position predicts nothing.
// A sequence shard's labels are next-token targets already. Undefined without labels.
at::Tensor shifted_labels(const CausalLMInput& in) {
  if (!in.labels.defined()) return {};
  if (in.shard) return in.labels.reshape({-1});
  const int64_t batch = in.labels.size(0), seq = in.labels.size(1);
  return at::cat({in.labels.narrow(1, 1, seq - 1), at::full({batch, 1}, -100, in.labels.options())}, 1).reshape({-1});
}

}  // namespace

CausalLMOutput CausalLM::forward(const CausalLMInput& in) {
  check_input(in, config_);
  if (!model_->holds_all()) {
    throw UserError("CausalLM::forward: this model holds only part of itself (a pipeline stage); run it through forward_span");
  }
  CausalLMOutput out;
  const bool want_router_logits = config_.num_experts > 0 && in.output_router_logits.value_or(config_.output_router_logits);
  std::vector<at::Tensor>* router_logits = want_router_logits ? &out.router_logits : nullptr;
  if (in.shard && !attention_core_) {
    throw UserError("CausalLM::forward: the input is a sequence shard and the model has no attention core; "
                    "install one with cp::parallelize_context");
  }
  const at::Tensor shifted = shifted_labels(in);
  const bool chunked = loss_chunk_tokens_ > 0 && shifted.defined();
  const at::Tensor result = fsdp::hooked_forward(*this, [&] {
    const at::Tensor hidden = model_->forward(in.input_ids, in.attention_mask, in.position_ids, in.document_mask, router_logits, in.cache,
                                             in.shard, in.shard ? attention_core_ : nullptr);
    return chunked ? chunked_loss_sum(hidden, shifted) : head(hidden, shifted.defined());
  });
  if (!shifted.defined()) {
    out.logits = token_loss_ ? token_loss_->full_logits(result) : result;
    return out;
  }
  if (chunked) {
    out.lm_loss_sum = result;
  } else {
    out.logits = result;
    out.lm_loss_sum = loss_sum(result, shifted);
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

at::Tensor CausalLM::loss_sum(const at::Tensor& logits, const at::Tensor& shifted) {
  const at::Tensor flat = logits.reshape({shifted.size(0), -1});
  return token_loss_ ? token_loss_->sum(flat, shifted) : cross_entropy_sum(flat, shifted);
}

at::Tensor CausalLM::head_loss_sum(const at::Tensor& hidden, const at::Tensor& shifted) {
  return loss_chunk_tokens_ > 0 ? chunked_loss_sum(hidden, shifted) : loss_sum(head(hidden, true), shifted);
}

// The head runs through its forward hooks (a column-parallel head under loss parallel). The
// plain loss reads bf16 logits as they are (cross_entropy.h): no [tokens x vocab] fp32 copy.
at::Tensor CausalLM::head(const at::Tensor& hidden, bool for_loss) {
  const at::Tensor logits = lm_head_ ? lm_head_->forward(hidden) : linear(hidden, tied_head_weight(), at::Tensor());
  return for_loss && !token_loss_ && logits.scalar_type() == at::kBFloat16 ? logits : logits.to(at::kFloat);
}

at::Tensor CausalLM::tied_head_weight() const {
  if (!model_->embed_tokens) throw std::logic_error("CausalLM: the tied head's embedding was dropped");
  return model_->embed_tokens->weight;
}

void CausalLM::keep_only(bool embedding, const std::vector<int64_t>& layers, bool head) {
  // A tied head is the embedding matrix: a span with the head keeps it.
  model_->keep_only(embedding || (head && tied()), layers, head);
  if (!head && lm_head_) {
    unregister_module("lm_head");
    lm_head_ = nullptr;
  }
}

namespace {

void check_span(const ModelSpan& span, const CausalLMInput& in, const at::Tensor& hidden, const ModelConfig& c) {
  if (span.layer_begin < 0 || span.layer_end < span.layer_begin || span.layer_end > c.num_hidden_layers) {
    throw UserError("CausalLM::forward_span: layers [" + std::to_string(span.layer_begin) + ", " + std::to_string(span.layer_end) +
                    ") are not a range of the model's " + std::to_string(c.num_hidden_layers) + " layers");
  }
  if (span.head && !in.labels.defined()) throw UserError("CausalLM::forward_span: a span with the head computes the loss; give labels");
  if (!span.embedding && (!hidden.defined() || hidden.dim() != 3 || hidden.size(0) != in.input_ids.size(0))) {
    throw UserError("CausalLM::forward_span: a span after the embedding starts from hidden states [batch, seq, hidden]");
  }
  if (in.cache) throw UserError("CausalLM::forward_span: incremental decoding runs the whole model (forward), not spans");
}

// Starts a segment at `x` when segments are separate: its input becomes a leaf of its own graph.
at::Tensor open_segment(std::vector<SpanSegment>* segments, const at::Tensor& x) {
  if (!segments) return x;
  segments->push_back({x.detach().requires_grad_(), {}, {}});
  return segments->back().input;
}

void close_segment(std::vector<SpanSegment>* segments, std::vector<at::Tensor> outputs, std::vector<at::Tensor> params) {
  if (!segments) return;
  segments->back().outputs = std::move(outputs);
  segments->back().params = std::move(params);
}

}  // namespace

SpanOutput CausalLM::forward_span(const CausalLMInput& in, const at::Tensor& hidden_in, const ModelSpan& span, bool separate_segments) {
  check_input(in, config_);
  check_span(span, in, hidden_in, config_);
  if ((span.embedding && !model_->embed_tokens) || (span.head && !model_->norm)) {
    throw UserError("CausalLM::forward_span: this model does not hold the " + std::string(span.head ? "head" : "embedding") + " of the span");
  }
  if (in.shard && !attention_core_) throw UserError("CausalLM::forward_span: a sequence shard needs an attention core");
  SpanOutput out;
  const bool want_router_logits = config_.num_experts > 0 && in.output_router_logits.value_or(config_.output_router_logits);
  std::vector<at::Tensor>* router_logits = want_router_logits ? &out.router_logits : nullptr;
  std::vector<SpanSegment>* segments = separate_segments ? &out.segments : nullptr;
  const at::Tensor shifted = span.head ? shifted_labels(in) : at::Tensor();
  const at::Tensor result = fsdp::hooked_forward(*this, [&] {
    at::Tensor hidden;
    if (span.embedding) {
      if (segments) segments->push_back({});
      hidden = model_->embed_tokens->forward(in.input_ids);
      close_segment(segments, {hidden}, {model_->embed_tokens->weight});
    } else {
      hidden = hidden_in;
    }
    const AttentionInputs inputs = model_->attention_inputs(in.input_ids.size(0), in.input_ids.size(1), hidden.scalar_type(),
                                                            in.attention_mask, in.position_ids, in.document_mask, nullptr, in.shard,
                                                            in.shard ? attention_core_ : nullptr);
    if (!segments) {
      hidden = model_->run_layers(hidden, inputs, span.layer_begin, span.layer_end, router_logits);
    } else {
      for (int64_t layer = span.layer_begin; layer < span.layer_end; ++layer) {
        const size_t routed = router_logits ? router_logits->size() : 0;
        hidden = model_->run_layers(open_segment(segments, hidden), inputs, layer, layer + 1, router_logits);
        std::vector<at::Tensor> outputs = {hidden};
        if (router_logits) outputs.insert(outputs.end(), router_logits->begin() + static_cast<int64_t>(routed), router_logits->end());
        close_segment(segments, std::move(outputs), model_->held_layer(layer)->parameters());
      }
    }
    if (!span.head) return hidden;
    const at::Tensor normed = (*model_->norm)(open_segment(segments, hidden));
    const at::Tensor sum = head_loss_sum(normed, shifted);
    std::vector<at::Tensor> params = model_->norm->parameters();
    for (const auto& p : lm_head_ ? lm_head_->parameters() : std::vector<at::Tensor>{tied_head_weight()}) params.push_back(p);
    close_segment(segments, {sum}, std::move(params));
    return sum;
  });
  // The hook point may hand back another tensor (a cast): the graph's end is what it returns.
  if (segments) segments->back().outputs.front() = result;
  if (span.head) {
    out.lm_loss_sum = result;
    out.label_tokens = shifted.ne(-100).sum().item<int64_t>();
  } else {
    out.hidden = result;
  }
  return out;
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
  // A plain head (no forward hooks: not a tensor-parallel one, no bias) and the built-in loss:
  // head and loss fused per chunk, no recompute (linear_cross_entropy.h).
  const bool plain_head = !lm_head_ || (nn::forward_hooks(*lm_head_).empty() && !lm_head_->bias.defined());
  if (!token_loss_ && plain_head) {
    return linear_cross_entropy_sum(rows, lm_head_ ? lm_head_->weight : tied_head_weight(), shifted_labels, loss_chunk_tokens_);
  }
  // Otherwise each chunk through run_with_recompute. The head's parameters leave through each
  // chunk (its `params`): every chunk reads them, and a tied head is the embedding too.
  std::vector<at::Tensor> head_params;
  for (const auto& p : lm_head_ ? lm_head_->parameters() : std::vector<at::Tensor>{tied_head_weight()}) {
    if (p.requires_grad()) head_params.push_back(p);
  }
  at::Tensor sum = at::zeros({}, at::kFloat);
  for (int64_t start = 0; start < rows.size(0); start += loss_chunk_tokens_) {
    const int64_t n = std::min(loss_chunk_tokens_, rows.size(0) - start);
    const at::Tensor labels = shifted_labels.narrow(0, start, n);
    sum = sum + run_with_recompute(
                    rows.narrow(0, start, n),
                    [this, labels](const at::Tensor& chunk, std::vector<at::Tensor>*) {
                      const at::Tensor logits = head(chunk, true);
                      return token_loss_ ? token_loss_->sum(logits, labels) : cross_entropy_sum(logits, labels);
                    },
                    nullptr, head_params);
  }
  return sum;
}

}  // namespace hyperparallel::models
