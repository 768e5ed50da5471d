// The all-to-all dispatch of expert parallelism (ep/expert_parallel.h): a sparse MoE block's
// (token, slot) pairs sent to the ranks of their experts, computed there, sent back and
// summed with the routing weights.
//
// Pairs are ordered by expert (stable, so a token's slots keep the reference's order;
// models/grouped_experts.h) — which is also by destination rank, since rank r holds a
// consecutive range of experts. After the
// count exchange each rank knows, per source rank and local expert, how many rows arrive;
// the received rows (source-major) are regrouped expert-major for the experts and the outputs
// put back in source order for the return trip. Each rank sums a token's expert outputs in
// expert order, as the one-process loop does.
#pragma once

#include <memory>

#include "hyperparallel/comm/communicator.h"
#include "models/moe.h"

namespace hyperparallel::ep {

class AllToAllDispatch : public models::ExpertDispatch {
 public:
  // `token_split`: ranks holding the same tokens (null: none); see expert_parallel.h.
  AllToAllDispatch(std::shared_ptr<comm::Communicator> ep, std::shared_ptr<comm::Communicator> token_split);
  at::Tensor combine(models::SparseMoeBlock& block, const at::Tensor& tokens, const models::Routing& routing) override;

 private:
  at::Tensor combine_own(models::SparseMoeBlock& block, const at::Tensor& tokens, const models::Routing& routing);

  std::shared_ptr<comm::Communicator> ep_, token_split_;
};

}  // namespace hyperparallel::ep
