#include "scratch_pool.h"

#include <ATen/ATen.h>

#include "hyperparallel/platform/host_allocator.h"

namespace hyperparallel::comm {

at::Tensor ScratchPool::acquire(int64_t nbytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(nbytes);
    if (it != free_.end() && !it->second.empty()) {
      at::Tensor t = std::move(it->second.back());
      it->second.pop_back();
      return t;
    }
  }
  return at::empty({nbytes}, at::TensorOptions().dtype(at::kByte));
}

void ScratchPool::release(at::Tensor buffer) {
  if (platform::CachingHostAllocator::installed()) return;  // the buffer's memory goes back to that cache
  std::lock_guard<std::mutex> lock(mutex_);
  auto& list = free_[buffer.numel()];
  if (list.size() < kKeepPerSize) list.push_back(std::move(buffer));
}

}  // namespace hyperparallel::comm
