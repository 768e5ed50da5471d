// ActivationSwapPool: the saved inputs of checkpointed layers moved to a host pool after
// their forward and brought back one layer ahead in backward (activation_checkpoint.h,
// swap_inputs).
//
// stash() copies a layer's input into the pool (a CUDA build copies to pinned host memory
// with a non-blocking transfer; here host and device are the same memory, so it is a copy) and
// the recompute function keeps only the slot. fetch() returns the input to the compute
// device — its prefetched copy when one is ready — frees the slot, and starts bringing back
// the slot stashed just before it: backward runs the layers in reverse, so that is the next
// layer's input. Slots are stashed and fetched in LIFO order within a forward and backward.
// Exact (copies), and every byte is counted both ways.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>

#include "hyperparallel/models/activation_checkpoint.h"

namespace hyperparallel::models {

class ActivationSwapPool {
 public:
  int64_t stash(const at::Tensor& input);
  at::Tensor fetch(int64_t slot);
  void discard(int64_t slot);  // drops a slot that will never be fetched (no-op if gone)
  const ActivationSwapTraffic& traffic() const { return traffic_; }

 private:
  struct Slot {
    at::Tensor host;    // the pool's copy
    at::Tensor device;  // brought back ahead of use (undefined until prefetched)
  };
  std::map<int64_t, Slot> slots_;
  int64_t next_ = 0;
  ActivationSwapTraffic traffic_;

  void bring_back(Slot& slot);
};

}  // namespace hyperparallel::models
