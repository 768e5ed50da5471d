// DecoderLayer and DecoderModel: the transformer body shared by every supported family.
//
// DecoderLayer (HF's <Family>DecoderLayer): pre-norm attention and feed-forward with
// residuals; its forward goes through the fully_shard hook point with the hidden states as
// the hooked input. DecoderModel (HF's <Family>Model): embed_tokens, layers, norm; it builds
// what every layer shares once per forward — rotary tables and the additive attention mask
// (causal, padding and, for packed rows, document boundaries).
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
  at::Tensor forward(const at::Tensor& hidden, const AttentionInputs& inputs, std::vector<at::Tensor>* router_logits);
  void replace_child(const std::string& name, std::shared_ptr<torch::nn::Module> replacement) override;

  std::shared_ptr<NormModule> input_layernorm, post_attention_layernorm;
  std::shared_ptr<AttentionModule> self_attn;
  std::shared_ptr<FeedForwardModule> mlp;
  bool recompute = false;  // activation checkpointing (models/activation_checkpoint.h)
  std::shared_ptr<ActivationSwapPool> swap;  // with recompute: where the saved input waits (null: kept)

 private:
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

  std::shared_ptr<Embedding> embed_tokens;
  torch::nn::ModuleList layers;
  std::vector<std::shared_ptr<DecoderLayer>> decoder_layers;
  std::shared_ptr<NormModule> norm;

 private:
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
