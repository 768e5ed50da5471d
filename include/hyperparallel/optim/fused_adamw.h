// FusedAdamW: torch::optim::AdamW's update in one pass over each parameter.
//
// LibTorch's AdamW runs seven tensor ops per parameter (decay, two moment updates, sqrt,
// scale, add eps, addcdiv), each a pass over memory; this one reads the parameter, its
// gradient and both moments once and writes the three back (tensors of 2^18 elements and more
// split over the intra-op thread count).
// The arithmetic is LibTorch's, in the same order and in fp32 (weight decay, moments,
// denominator sqrt(v) / sqrt(1 - beta2^t) + eps, step lr / (1 - beta1^t)), with multiply-adds
// fused exactly where LibTorch's kernels fuse them, so the results are the same floats. It is
// an AdamW (same options, param groups and AdamWParamState per parameter), so checkpoints,
// schedules and code that takes a torch::optim::AdamW are unchanged. Parameters it cannot
// fuse (not contiguous fp32, amsgrad, sparse gradients) take the tensor-op path. offload_state() keeps the moments in a file-backed mapping instead.
#pragma once

#include <torch/optim/adamw.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hyperparallel/optim/state_file.h"

namespace hyperparallel::optim {

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  ~FusedAdamW() override;
  at::Tensor step(LossClosure closure = nullptr) override;

  // Optimizer-state offload: every AdamW moment moves into a file in `dir`
  // (optim/state_file.h); each step reads a parameter's moments ahead before its update and
  // releases them after, so resident optimizer state is about one parameter's. State set
  // later (a checkpoint load) moves into the file at the next step. Same numbers, bit for bit.
  // `extra_numels`: room in the same file for other fp32 buffers (extra_tensor(k)), such as
  // FSDP's master shards under mixed precision (fsdp::place_master_shards); a parameter whose
  // data lives in the file is read ahead and released around its update like its moments.
  void offload_state(const std::string& dir, const std::vector<int64_t>& extra_numels = {});
  at::Tensor extra_tensor(size_t k) const;
  OptimizerStateFile* state_file() const { return file_.get(); }

 protected:
  void step_groups(size_t count);  // AdamW on the first `count` param groups
  // With offload_state: `p`'s moments in the file and asked for (moments set from outside are
  // copied in), and released after its update.
  void stream_in(const at::Tensor& p, torch::optim::AdamWParamState& s);
  void release_state(const at::Tensor& p);

 private:
  std::unique_ptr<OptimizerStateFile> file_;
  std::map<const void*, size_t> file_slot_;  // parameter (its TensorImpl, the optimizer state key) -> its moments' first slot in file_
  size_t first_extra_slot_ = 0;
  std::vector<int64_t> extra_numels_;

  torch::optim::AdamWParamState& state_of(const at::Tensor& p);
};

}  // namespace hyperparallel::optim
