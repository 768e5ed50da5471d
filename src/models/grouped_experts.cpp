// Sort-once expert grouping. See grouped_experts.h.
#include "grouped_experts.h"

#include <ATen/ATen.h>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::models {

SortedPairs sort_pairs_by_expert(const Routing& routing, int64_t num_experts) {
  at::Tensor pair_expert = routing.selected.reshape({-1});
  // Dropped pairs (over capacity) sort behind every expert's, into a bin that is cut off.
  if (routing.kept.defined()) pair_expert = pair_expert.masked_fill(routing.kept.reshape({-1}).logical_not(), num_experts);
  SortedPairs pairs;
  const at::Tensor counts = at::bincount(pair_expert, {}, num_experts + 1).to(at::kLong).contiguous();
  pairs.counts.assign(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + num_experts);
  const int64_t kept = pair_expert.numel() - counts.data_ptr<int64_t>()[num_experts];
  pairs.order = std::get<1>(at::sort(pair_expert, c10::optional<bool>(true), /*dim=*/0)).narrow(0, 0, kept);
  pairs.token = at::div(pairs.order, routing.selected.size(1), "floor");
  return pairs;
}

at::Tensor sum_weighted_outputs(const at::Tensor& tokens, const SortedPairs& pairs, const at::Tensor& outputs,
                                const Routing& routing) {
  const at::Tensor weights = routing.weights.reshape({-1}).index_select(0, pairs.order).unsqueeze(-1);
  return at::zeros_like(tokens).index_add(0, pairs.token, (outputs * weights).to(tokens.scalar_type()));
}

at::Tensor GroupedExpertDispatch::combine(SparseMoeBlock& block, const at::Tensor& tokens, const Routing& routing) {
  const SortedPairs pairs = sort_pairs_by_expert(routing, block.num_experts);
  const at::Tensor outputs = block.run_local_experts(tokens.index_select(0, pairs.token), pairs.counts);
  return sum_weighted_outputs(tokens, pairs, outputs, routing);
}

std::shared_ptr<torch::nn::Module> make_grouped_experts(torch::nn::Module& original, const ModelConfig&) {
  auto* block = dynamic_cast<SparseMoeBlock*>(&original);
  if (!block) throw UserError("grouped_experts replaces sparse MoE blocks (Qwen3MoeSparseMoeBlock), not " + original.name());
  if (block->dispatch) throw UserError("grouped_experts: " + original.name() + " already dispatches its tokens");
  block->dispatch = std::make_shared<GroupedExpertDispatch>();
  return original.shared_from_this();
}

}  // namespace hyperparallel::models
