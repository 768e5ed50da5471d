// Sparse mixture-of-experts feed-forward (Qwen3-MoE) and its load-balancing loss.
//
// A linear router (`gate`) scores every token against every expert; each token goes to
// its top-k experts (SwiGLU MLPs under `experts.<i>`) and their outputs are summed with the
// softmax routing weights (renormalised over the top k when norm_topk_prob). The loop over
// experts and its accumulation order follow transformers' Qwen3MoeSparseMoeBlock, so the
// result matches it to rounding. Experts are addressable by name so expert parallelism can
// be applied from outside later.
#pragma once

#include <torch/nn/modules/container/modulelist.h>

#include <memory>
#include <vector>

#include "hyperparallel/models/model_config.h"
#include "layers.h"

namespace hyperparallel::models {

class SparseMoeBlock : public FeedForwardModule {
 public:
  SparseMoeBlock(const ModelConfig& config, ParamFactory& factory);
  at::Tensor forward(const at::Tensor& x, std::vector<at::Tensor>* router_logits) override;

  int64_t num_experts, top_k;
  bool norm_topk_prob;
  std::shared_ptr<Linear> gate;
  torch::nn::ModuleList experts;
  std::vector<std::shared_ptr<Mlp>> expert_mlps;
};

// The sums transformers' load_balancing_loss_func is made of, for a batch: `counts` [k, E]
// (tokens routed to each expert in each top-k slot; no gradient), `prob_sums` [E] (router
// probabilities summed over tokens; with gradient) and `tokens` (tokens counted, times the MoE
// layers). router_logits holds one [B*T, experts] tensor per MoE layer; attention_mask [B, T]
// (undefined = every token counts) leaves out padding. Sums of several batches (micro-batches,
// ranks) add up to the sums of the pooled batch, so the loss of a whole global batch can be
// had from all-reduced sums (the trainer's moe_aux_loss_scope: global).
struct RoutingSums {
  at::Tensor counts, prob_sums;
  double tokens = 0;
};
RoutingSums routing_sums(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k, const at::Tensor& attention_mask);

// E * sum over slots and experts of (counts / tokens) * (prob_sums / tokens): the loss of the
// batch the sums describe.
at::Tensor load_balancing_loss(const RoutingSums& sums, int64_t num_experts);

// transformers' load_balancing_loss_func over one forward's router logits.
at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k,
                               const at::Tensor& attention_mask);

}  // namespace hyperparallel::models
