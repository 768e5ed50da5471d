// ScratchPool: reusable byte buffers for the finishing steps of composite collectives.
//
// Why: on these machines the first touch of fresh memory costs ~3 ms per MiB (page
// faults), more than moving the same bytes over loopback; glibc returns allocations above
// 32 MiB to the kernel on free. Reusing warm buffers keeps a 64 MiB reduce-scatter near the
// speed of the all-to-all under it. A buffer is taken for one collective and given back in
// its finishing step; buffers of a size stay cached (at most kKeepPerSize) until the
// communicator goes away. Where the process runs the caching host allocator
// (platform/host_allocator.h) nothing is kept here: that cache keeps the pages warm and lends
// them to requests of any size.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <mutex>
#include <vector>

namespace hyperparallel::comm {

class ScratchPool {
 public:
  static constexpr size_t kKeepPerSize = 4;

  // A 1-D uint8 tensor of exactly `nbytes`, warm when one of that size was given back.
  at::Tensor acquire(int64_t nbytes);
  void release(at::Tensor buffer);

 private:
  mutable std::mutex mutex_;
  std::map<int64_t, std::vector<at::Tensor>> free_;
};

}  // namespace hyperparallel::comm
