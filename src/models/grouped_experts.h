// Grouped experts: a sparse MoE block's (token, slot) pairs sorted by expert once, each
// expert run on its contiguous rows, the outputs summed per token in one scatter-add —
// instead of the reference loop's per-expert scan of the routing mask, gather and add.
//
// The same grouping serves expert parallelism (src/ep/token_dispatch.h), which sends the
// sorted rows to other ranks between the sort and the experts. The `grouped_experts` plan
// override (plan_overrides.h) installs GroupedExpertDispatch on a block; parameters, names and
// checkpoints are unchanged. Sums per token run in expert order, as the loop's do, so the
// result equals it to rounding (the experts' GEMMs see the same rows).
#pragma once

#include <memory>
#include <vector>

#include "moe.h"

namespace hyperparallel::models {

struct SortedPairs {
  at::Tensor order;             // kept pair indices (token * k + slot) sorted by expert, stable
  at::Tensor token;             // the token of each sorted pair
  std::vector<int64_t> counts;  // kept pairs per expert [E] (pairs over capacity are left out)
};
SortedPairs sort_pairs_by_expert(const Routing& routing, int64_t num_experts);

// zeros_like(tokens) plus, for each sorted pair, its expert's output row times its routing weight.
at::Tensor sum_weighted_outputs(const at::Tensor& tokens, const SortedPairs& pairs, const at::Tensor& outputs,
                                const Routing& routing);

class GroupedExpertDispatch : public ExpertDispatch {
 public:
  at::Tensor combine(SparseMoeBlock& block, const at::Tensor& tokens, const Routing& routing) override;
};

// The plan override: the same block (Qwen3MoeSparseMoeBlock) with GroupedExpertDispatch.
std::shared_ptr<torch::nn::Module> make_grouped_experts(torch::nn::Module& original, const ModelConfig& config);

}  // namespace hyperparallel::models
