// DecoderLayer and DecoderModel: the transformer body shared by every supported family.
//
// DecoderLayer (HF's <Family>DecoderLayer): pre-norm attention and feed-forward with
// residuals; its forward goes through the fully_shard hook point with the hidden states as
// the hooked input. DecoderModel (HF's <Family>Model): embed_tokens, layers, norm; it builds
// what every layer shares once per forward — rotary tables and the additive attention mask
// (causal, padding and, for packed rows, document boundaries). Its pieces (attention_inputs,
// run_layers) are public so a pipeline stage can run a range of layers, and keep_only drops
// what a stage does not hold; the model itself stays parallelism-free.
#pragma once

#include <torch/nn/modules/container/modulelist.h>

#include <memory>
#include <string>
#include <vector>

#include "hyperparallel/models/model_config.h"
#include "hyperparallel/models/module_interfaces.h"
#include "layers.h"

namespace hyperparallel::models {

class ActivationSwapPool;  // activation_swap.h

class DecoderLayer : public torch::nn::Module, public ModuleSlots {
 public:
  DecoderLayer(const ModelConfig& config, int64_t index, ParamFactory& factory);
  int64_t index() const { return index_; }  // its place in the whole model (model.layers.<index>)
  at::Tensor forward(const at::Tensor& hidden, const AttentionInputs& inputs, std::vector<at::Tensor>* router_logits);
  void replace_child(const std::string& name, std::shared_ptr<torch::nn::Module> replacement) override;

  std::shared_ptr<NormModule> input_layernorm, post_attention_layernorm;
  std::shared_ptr<AttentionModule> self_attn;
  std::shared_ptr<FeedForwardModule> mlp;
  bool recompute = false;  // activation checkpointing (models/activation_checkpoint.h)
  // With recompute: the Linears' outputs are kept and handed back to the recompute, which then
  // reruns only the rest (selective, op policy: linear_outputs.h).
  bool keep_linear_outputs = false;
  std::shared_ptr<ActivationSwapPool> swap;  // with recompute: where the saved input waits (null: kept)

 private:
  int64_t index_;
  at::Tensor body(const at::Tensor& x, const AttentionInputs& inputs, std::vector<at::Tensor>* router_logits);
};

class DecoderModel : public torch::nn::Module, public ModuleSlots {
 public:
  DecoderModel(const ModelConfig& config, ParamFactory& factory);
  // Final hidden states [B, T, hidden] (after the final norm). With a cache the tokens follow
  // the cached ones: attention_mask then covers [B, T_past + T] and positions default to
  // T_past.. (document masking applies to a first call only). With a sequence shard
  // (context parallelism) there is no dense mask: every attention calls `core` with the shard.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask, const at::Tensor& position_ids,
                     bool document_mask, std::vector<at::Tensor>* router_logits, KVCache* cache = nullptr,
                     std::shared_ptr<const SequenceShard> shard = nullptr, std::shared_ptr<AttentionCore> core = nullptr);
  void replace_child(const std::string& name, std::shared_ptr<torch::nn::Module> replacement) override;

  // forward() in pieces, for running part of the model (a pipeline stage, pp/): what every
  // layer of one forward shares (rotary tables from the positions, the mask or the shard), and
  // the held layers with begin <= index < end in order (UserError if one of them is not held).
  AttentionInputs attention_inputs(int64_t batch, int64_t seq, at::ScalarType dtype, const at::Tensor& attention_mask,
                                   const at::Tensor& position_ids, bool document_mask, KVCache* cache,
                                   std::shared_ptr<const SequenceShard> shard, std::shared_ptr<AttentionCore> core) const;
  at::Tensor run_layers(at::Tensor hidden, AttentionInputs inputs, int64_t begin, int64_t end,
                        std::vector<at::Tensor>* router_logits, std::vector<at::Tensor>* layer_outputs = nullptr);
  // Keeps the embedding only if `embedding`, the layers listed (by index) and the final norm only
  // if `final_norm`; the rest leaves the module tree, so named_parameters() lists what is kept
  // under HF's full names (model.layers.<index>...).
  void keep_only(bool embedding, const std::vector<int64_t>& layer_indices, bool final_norm);
  bool holds_all() const;  // nothing dropped by keep_only
  std::shared_ptr<DecoderLayer> held_layer(int64_t index) const;  // UserError if not held

  std::shared_ptr<Embedding> embed_tokens;  // null when not kept
  torch::nn::ModuleList layers;
  std::vector<std::shared_ptr<DecoderLayer>> decoder_layers;  // the held layers, by index
  std::shared_ptr<NormModule> norm;  // null when not kept

 private:
  int64_t num_layers_ = 0;
  at::Tensor inv_freq_;  // not a parameter or buffer: recomputed from the config, as in HF
};

// The additive mask [B, 1, T, past + T] in `dtype`: 0 where query i may see key j
// (j <= past + i, key not padding, same document), the dtype's lowest value elsewhere (as
// transformers does: a row with nothing visible then softmaxes to uniform instead of NaN).
// `attention_mask` covers all past + T keys.
at::Tensor build_attention_mask(int64_t batch, int64_t seq, const at::Tensor& attention_mask, const at::Tensor& position_ids,
                                bool document_mask, at::ScalarType dtype, int64_t past = 0);

// The score of a masked key, as transformers writes it: the dtype's lowest finite value.
double masked_score(at::ScalarType dtype);

}  // namespace hyperparallel::models
