// Expert parallelism: the experts of every sparse MoE block divided among the ranks of an
// `ep` mesh axis, tokens sent to the rank of each expert they are routed to and back.
//
//   ep::parallelize_experts(model, expert_mesh["ep"]);            // before fully_shard
//   for (auto* experts : ep::expert_modules(model)) {              // optional: FSDP over edp
//     fsdp::FullyShardOptions o;
//     o.mesh = expert_mesh["edp"];
//     fsdp::fully_shard(*experts, o);
//   }
//
// Rank r of an ep group of size P holds experts [r·E/P, (r+1)·E/P) of each block (E must
// divide by P; a UserError lists the sizes that fit). A block's forward routes its tokens as
// before (router, top-k, weights), then dispatches: the per-expert token counts are exchanged
// first (one small all-to-all), every (token, slot) pair is sent to its expert's rank in one
// all-to-all with uneven splits, the local experts run on their rows, the outputs come back
// in a second all-to-all and are summed per token with the routing weights. Backward runs the
// same exchanges in reverse (dtensor/functional_collectives.h). Dropless: every routed pair is
// computed, however unbalanced the routing (all tokens to one expert, experts with none).
//
// Ranks that hold the same tokens (a tensor-parallel group: `token_split` below) would send
// them twice; each sends only its 1/size slice of the block's tokens and the outputs are
// gathered back, so every pair is computed once and the result stays replicated.
//
// The dropped experts' parameters are recorded as owned parameters (dtensor/parameter_specs.h),
// so full_parameters, loading from HF folders or checkpoints of any layout and the gradient
// norm see the whole model. Expert gradients are sums over every token routed to them; data
// parallelism over the ranks holding the same experts (edp) is FSDP over expert_modules().
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/mesh/device_mesh.h"

namespace torch::nn {
class Module;
}

namespace hyperparallel::ep {

struct ExpertParallelOptions {
  // Ranks that see the same tokens in each block (the tp group); null or size 1: none.
  std::shared_ptr<comm::Communicator> token_split;
};

// Applies expert parallelism to every sparse MoE block under `root` over `ep_mesh` (1-D).
// Returns the blocks' full names. UserError when the model has no MoE block or an expert
// count does not divide by the ep size.
std::vector<std::string> parallelize_experts(torch::nn::Module& root, const mesh::DeviceMesh& ep_mesh,
                                             const ExpertParallelOptions& options = {});

// The `experts` containers of the MoE blocks under `root`, in module order: what FSDP shards
// over the expert-data-parallel ranks.
std::vector<torch::nn::Module*> expert_modules(torch::nn::Module& root);

// The ep degrees up to `limit` that divide `num_experts`, as "1, 2, 4".
std::string valid_ep_sizes(int64_t num_experts, int64_t limit);

// Expert capacity for every MoE block under `root`: each expert takes at most
// ceil(factor x N x k / E) of a forward's N x k (token, slot) pairs — first choices before
// second ones, in token order — and drops the rest (they add nothing; the residual carries the
// token). Decided per forward on the tokens the block sees (before tensor-parallel ranks split
// them), so a run with a capacity equals another layout only at the same micro-batches.
// 0 (the default): dropless. With or without expert parallelism.
void set_expert_capacity(torch::nn::Module& root, double factor);

// Pairs routed and dropped by the MoE blocks under `root` since the last call (then reset).
struct ExpertLoad {
  int64_t routed = 0, dropped = 0;
};
ExpertLoad take_expert_load(torch::nn::Module& root);

}  // namespace hyperparallel::ep
