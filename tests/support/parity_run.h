// What a parity test records of a training run, and the comparison against the plain model:
// each step's loss and gradient norm, and the final parameters whole. The same helpers serve the
// plain one-process run (ctx null) and the parallel one.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "support/multiprocess.h"

namespace torch::nn {
class Module;
}

namespace hyperparallel::testing {

struct ParityRun {
  std::vector<double> losses, grad_norms;
  std::map<std::string, at::Tensor> params;
};

// After a step's backward: the step's loss — `loss` of this rank summed over the world and divided
// by `copies` (the ranks that computed the same tokens, e.g. a tp group) — and the gradient norm
// (fsdp::clip_grad_norm_ under parallelism, the plain model's own gradients without).
void record_step(ParityRun& run, const RankContext* ctx, torch::nn::Module& model, const at::Tensor& loss, double copies);

// The final parameters: the full state dict under parallelism, the plain model's tensors without.
void record_parameters(ParityRun& run, const RankContext* ctx, torch::nn::Module& model);

// Every loss and gradient norm within `tolerance` relative, every parameter `compare` accepts
// (all when null) within `tolerance` of its largest value.
void expect_same_training(const ParityRun& ref, const ParityRun& got, double tolerance,
                          const std::function<bool(const std::string&)>& compare = nullptr);

}  // namespace hyperparallel::testing
