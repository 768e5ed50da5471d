// The global gradient norm of a sharded model, and clipping by it — what
// torch::nn::utils::clip_grad_norm_ cannot do here: it would clip by each rank's own norm.
//
// Each rank holds pieces of the gradients: FSDP shards (over dp_shard), tensor-parallel pieces
// (a recorded parameter spec, dtensor/parameter_specs.h), and copies (HSDP replicas, tp ranks
// holding a parameter whole, fully_shard's replicate_params). A piece's squared norm is
// weighted by 1 / (the number of ranks holding it), so the sum over the world counts every
// element once; one all-reduce in fp64.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "hyperparallel/comm/communicator.h"

namespace torch::nn {
class Module;
}

namespace hyperparallel::fsdp {

// Per parameter of root.parameters(), in order: 1 / (ranks of a `world_size` world holding
// the same gradient piece). With pipeline stages, each rank holds only its stages' parameters:
// the ranks of other stages hold none of these. No communication.
std::vector<double> gradient_norm_weights(torch::nn::Module& root, int64_t world_size, int64_t pipeline_stages = 1);

// This rank's weighted sum of squared gradients (an fp64 scalar tensor), to all-reduce with
// other per-step sums in one collective.
at::Tensor local_squared_gradient_norm(torch::nn::Module& root, const std::vector<double>& weights);

// The global norm (one all-reduce over `world`), then every gradient scaled by
// max_norm / (norm + 1e-6) when that is below 1, as PyTorch's clip_grad_norm_. max_norm <= 0:
// only the norm. Returns the norm before clipping. Collective over `world`.
double clip_grad_norm_(torch::nn::Module& root, double max_norm, comm::Communicator& world, int64_t pipeline_stages = 1);

}  // namespace hyperparallel::fsdp
