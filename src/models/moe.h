// Sparse mixture-of-experts feed-forward (Qwen3-MoE) and its load-balancing loss.
//
// A linear router (`gate`) scores every token against every expert; each token goes to
// its top-k experts (SwiGLU MLPs under `experts.<i>`) and their outputs are summed with the
// softmax routing weights (renormalised over the top k when norm_topk_prob). The loop over
// experts and its accumulation order follow transformers' Qwen3MoeSparseMoeBlock, so the
// result matches it to rounding.
//
// Experts are children of `experts` named by their global index ("experts.5.gate_proj"), as
// in HF checkpoints. Expert parallelism (ep/expert_parallel.h) is applied from outside: it
// drops the experts another rank holds and installs an ExpertDispatch that moves tokens to
// their experts and back; the block then only routes and hands the dispatch its local
// experts. Without a dispatch every expert is local and runs in this process.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "hyperparallel/models/model_config.h"
#include "layers.h"

namespace hyperparallel::models {

class SparseMoeBlock;

// The router's decision for a block's tokens [N, hidden]: `selected` [N, k] expert indices,
// `weights` [N, k] their routing weights (in the tokens' dtype, with gradient), and with a
// capacity `kept` [N, k] (bool: the pairs within their expert's capacity; undefined: all).
struct Routing {
  at::Tensor selected, weights, kept;
};

// Capacity: each expert takes at most ceil(factor x N x k / E) of a forward's N x k pairs;
// pairs compete in priority order — every token's first choice (in token order) before any
// second choice — and the rest are dropped (contribute nothing; the token keeps its other
// experts and the residual). Returns `kept` [N, k].
at::Tensor pairs_within_capacity(const at::Tensor& selected, int64_t num_experts, double factor);

// Computes a block's output from its tokens and their routing: where the experts run and how
// the tokens get there. Implemented by expert parallelism (src/ep/token_dispatch.h).
class ExpertDispatch {
 public:
  virtual ~ExpertDispatch() = default;
  virtual at::Tensor combine(SparseMoeBlock& block, const at::Tensor& tokens, const Routing& routing) = 0;
};

class SparseMoeBlock : public FeedForwardModule {
 public:
  SparseMoeBlock(const ModelConfig& config, ParamFactory& factory);
  at::Tensor forward(const at::Tensor& x, std::vector<at::Tensor>* router_logits) override;

  // Expert `e` (a global index); null when another rank holds it.
  const std::shared_ptr<Mlp>& expert(int64_t e) const { return expert_mlps.at(static_cast<size_t>(e)); }
  // Keeps experts [first, first + count) and unregisters the rest.
  void keep_experts(int64_t first, int64_t count);
  // Runs the local experts on `grouped` [sum(counts), hidden]: the first counts[0] rows go to
  // expert first_local, the next counts[1] to the one after, and so on (a count may be 0: every
  // local expert runs, so its parameters get a gradient in every step). Runs inside `experts`'
  // forward hooks, so FSDP may shard the experts as one unit. Returns the outputs, same rows.
  at::Tensor run_local_experts(const at::Tensor& grouped, const std::vector<int64_t>& counts);

  int64_t num_experts, top_k;
  bool norm_topk_prob;
  double capacity_factor = 0;                // 0: dropless (HF); > 0: see pairs_within_capacity
  int64_t routed_pairs = 0, dropped_pairs = 0;  // counted by forward, not by a recompute (ep::take_expert_load resets)
  int64_t first_local = 0, local_count = 0;  // the experts this rank holds
  std::shared_ptr<Linear> gate;
  std::shared_ptr<torch::nn::Module> experts;  // children "0" .. "E-1" (the local ones)
  std::vector<std::shared_ptr<Mlp>> expert_mlps;  // by global index; null when not local
  std::shared_ptr<ExpertDispatch> dispatch;       // null: every expert runs here

 private:
  // transformers' loop: per expert, its pairs' rows gathered, computed, weighted and added.
  at::Tensor loop_over_experts(const at::Tensor& tokens, const Routing& routing);
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
