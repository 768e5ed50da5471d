// CausalLM: a Hugging Face decoder-only language model (Llama, Qwen2, Qwen3, Qwen3-MoE) as a
// LibTorch module tree with HF's names, and AutoModelForCausalLM to build or load one.
//
// The tree is exactly HF's: `model.embed_tokens`, `model.layers.<i>.{input_layernorm,
// self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp...}`, `model.norm`, `lm_head`
// (absent when the embeddings are tied), so named_parameters() equals the checkpoint's key
// set. Models hold no parallelism: fully_shard and later plans apply from outside by name
// (decoder_layers() lists the natural units), and every decoder layer and the model itself
// run through the fully_shard hook point.
//
// forward() takes a batch of token ids with an optional padding mask, position_ids and
// labels. Packed sequences: position_ids that restart at 0 start a new document, and with
// `document_mask` on (the default) no token attends across documents. The loss is
// transformers' (mean cross-entropy of next-token prediction over labels != -100, plus
// router_aux_loss_coef times the load-balancing loss for MoE with router logits on); the
// sum and token count are returned too so a trainer can normalise over a global batch.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hyperparallel/models/model_config.h"
#include "hyperparallel/models/module_interfaces.h"

namespace hyperparallel::models {

struct CausalLMInput {
  at::Tensor input_ids;       // [B, T] int64
  at::Tensor attention_mask;  // [B, T], 1 = token, 0 = padding; undefined = all tokens
  at::Tensor position_ids;    // [B, T]; undefined = 0..T-1 per row
  at::Tensor labels;          // [B, T] int64, -100 = ignored; undefined = no loss
  bool document_mask = true;  // position_ids restarting at 0 separate documents
  std::optional<bool> output_router_logits;  // MoE: default from the config
  // Incremental decoding: the tokens follow those cached (attention_mask, when given, then
  // covers [B, T_past + T]); their keys and values are appended. See models/generation.h.
  KVCache* cache = nullptr;
  // Context parallelism: this input holds the shard's tokens of longer rows (cp/context_parallel.h
  // makes it). position_ids are then required (the tokens' positions in their rows) and labels
  // are already next-token targets (shifted in the full rows, -100 for none); the mask comes
  // from the shard, attention from the installed AttentionCore.
  std::shared_ptr<const SequenceShard> shard;
};

struct CausalLMOutput {
  // [B, T, vocab], fp32; with labels and no TokenLoss, the head's own dtype (bf16 under bf16
  // compute: what the fused loss read; its fp32 cast is exact); undefined with a chunked loss
  at::Tensor logits;
  at::Tensor loss;          // lm_loss (+ coef * aux_loss); undefined without labels
  at::Tensor lm_loss;       // mean next-token cross-entropy over label tokens (0 if none)
  at::Tensor lm_loss_sum;   // its sum, for normalising over a global batch
  int64_t label_tokens = 0;
  at::Tensor aux_loss;      // MoE load-balancing loss when router logits are on
  std::vector<at::Tensor> router_logits;  // MoE: one [B*T, experts] per sparse layer
};

// How next-token prediction's loss comes from the head's logits. The default is plain
// cross-entropy; tensor parallelism's loss parallel installs one that works on vocab-sharded
// logits without gathering them (tp/loss_parallel.h). The loss leaves the model this way.
class TokenLoss {
 public:
  virtual ~TokenLoss() = default;
  // Sum over labels != -100 of -log softmax(logits)[label]; logits [N, V] (or this rank's
  // vocab shard), labels [N].
  virtual at::Tensor sum(const at::Tensor& logits, const at::Tensor& labels) = 0;
  // Whole-vocabulary logits (for decoding) from the head's output.
  virtual at::Tensor full_logits(const at::Tensor& logits) { return logits; }
  // Whether it takes this rank's vocab shard of the logits (loss parallel) or all of them.
  virtual bool takes_vocab_shards() const { return false; }
};

// A contiguous part of the model, for one pipeline stage (pp/pipeline.h).
struct ModelSpan {
  int64_t layer_begin = 0, layer_end = 0;  // decoder layers [begin, end)
  bool embedding = false;                  // starts at the token ids (else at hidden states)
  bool head = false;                       // ends with the final norm, the head and the loss
};

// One piece of a span's autograd graph, for a backward split into input and weight gradients
// (zero-bubble schedules): `input` (a leaf; undefined for the embedding) -> `outputs` (the
// piece's result first, then a sparse layer's router logits) through `params`.
struct SpanSegment {
  at::Tensor input;
  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> params;
};

struct SpanOutput {
  at::Tensor hidden;       // [B, T, hidden] for the next span; undefined for a head span
  at::Tensor lm_loss_sum;  // a head span with labels: as CausalLMOutput
  int64_t label_tokens = 0;
  std::vector<at::Tensor> router_logits;  // of this span's sparse layers
  std::vector<SpanSegment> segments;      // with separate_segments: embedding?, each layer, head?
};

class DecoderModel;  // src/models/decoder.h
class Linear;        // src/models/layers.h

class CausalLM : public torch::nn::Module {
 public:
  CausalLM(const ModelConfig& config, bool deferred_init, uint64_t seed, at::ScalarType dtype);
  CausalLMOutput forward(const CausalLMInput& input);
  const ModelConfig& config() const { return config_; }
  // The decoder layers in order (the usual fully_shard units), as modules.
  std::vector<torch::nn::Module*> decoder_layers();
  DecoderModel& backbone() { return *model_; }
  bool tied() const { return config_.tie_word_embeddings; }
  // Null: plain cross-entropy. With a TokenLoss installed, CausalLMOutput::logits holds what
  // the head computed when labels are given (a vocab shard under loss parallel), whole logits
  // otherwise.
  void set_token_loss(std::shared_ptr<TokenLoss> loss) { token_loss_ = std::move(loss); }
  const std::shared_ptr<TokenLoss>& token_loss() const { return token_loss_; }
  // Chunked loss: with labels, the head and the loss run on `tokens` rows of the flattened
  // hidden states at a time — a plain head fused with the loss per chunk, no recompute
  // (models/linear_cross_entropy.h); a hooked (tensor-parallel) head or a custom token loss with
  // each chunk's logits recomputed in backward (models/recompute.h) — so the [tokens x vocab]
  // logits never exist whole; CausalLMOutput::logits is then left
  // undefined. 0 (the default): off. UserError for a negative count.
  void set_loss_chunk_tokens(int64_t tokens);
  int64_t loss_chunk_tokens() const { return loss_chunk_tokens_; }
  // The attention of inputs that carry a SequenceShard (context parallelism); inputs with whole
  // rows keep the local attention. Null: none (a sharded input is then a UserError).
  void set_attention_core(std::shared_ptr<AttentionCore> core) { attention_core_ = std::move(core); }
  const std::shared_ptr<AttentionCore>& attention_core() const { return attention_core_; }

  // Pipeline stages (pp/pipeline.h). keep_only drops from the module tree all but the embedding
  // (if `embedding`), the listed decoder layers and the final norm and head (if `head`); a
  // model holding part of itself runs only through forward_span. forward_span runs `span` on
  // `in` (ids, positions, mask and labels of the micro-batch, as for forward) from `hidden`
  // (the previous span's output; ignored when the span starts at the embedding), through the
  // fully_shard hook point like forward. With separate_segments each layer (and the
  // embedding, and the head with its loss) gets its own autograd graph from a leaf input,
  // listed in SpanOutput::segments; the span's result is then the last segment's output.
  void keep_only(bool embedding, const std::vector<int64_t>& layers, bool head);
  SpanOutput forward_span(const CausalLMInput& in, const at::Tensor& hidden, const ModelSpan& span, bool separate_segments = false);

 private:
  ModelConfig config_;
  std::shared_ptr<DecoderModel> model_;
  std::shared_ptr<Linear> lm_head_;  // null when tied: the head is embed_tokens.weight
  std::shared_ptr<TokenLoss> token_loss_;
  int64_t loss_chunk_tokens_ = 0;
  std::shared_ptr<AttentionCore> attention_core_;

  at::Tensor chunked_loss_sum(const at::Tensor& hidden, const at::Tensor& shifted_labels);
  // The head's logits: fp32, or in the head's dtype where the plain loss reads them (`for_loss`).
  at::Tensor head(const at::Tensor& hidden, bool for_loss = false);
  at::Tensor loss_sum(const at::Tensor& logits, const at::Tensor& shifted_labels);
  at::Tensor head_loss_sum(const at::Tensor& hidden, const at::Tensor& shifted_labels);
  at::Tensor tied_head_weight() const;
};

}  // namespace hyperparallel::models
