// FusedAdamW: torch::optim::AdamW's update in one pass over each parameter.
//
// LibTorch's AdamW runs seven tensor ops per parameter (decay, two moment updates, sqrt,
// scale, add eps, addcdiv), each a pass over memory; this one reads the parameter, its
// gradient and both moments once and writes the three back (tensors of 2^18 elements and more
// split over the intra-op thread count).
// The arithmetic is LibTorch's, in the same order and in fp32 (weight decay, moments,
// denominator sqrt(v) / sqrt(1 - beta2^t) + eps, step lr / (1 - beta1^t)), so the results
// agree to rounding. It is an AdamW (same options, param groups and AdamWParamState per
// parameter), so checkpoints, schedules and code that takes a torch::optim::AdamW are
// unchanged. Parameters it cannot fuse (not contiguous fp32, amsgrad, sparse gradients) take
// the tensor-op path.
#pragma once

#include <torch/optim/adamw.h>

namespace hyperparallel::optim {

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  at::Tensor step(LossClosure closure = nullptr) override;

 protected:
  void step_groups(size_t count);  // AdamW on the first `count` param groups
};

}  // namespace hyperparallel::optim
