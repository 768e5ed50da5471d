#include "flat_buffers.h"

#include <c10/core/CPUAllocator.h>

#include "hyperparallel/platform/host_allocator.h"

namespace hyperparallel::fsdp {

c10::DataPtr WarmMemoryPool::take(size_t nbytes) {
  if (platform::CachingHostAllocator::installed()) return c10::GetCPUAllocator()->allocate(nbytes);
  auto& list = free_[nbytes];
  if (!list.empty()) {
    c10::DataPtr p = std::move(list.back());
    list.pop_back();
    return p;
  }
  return c10::GetCPUAllocator()->allocate(nbytes);
}

void WarmMemoryPool::give(size_t nbytes, c10::DataPtr memory) {
  if (platform::CachingHostAllocator::installed()) return;  // `memory` goes back to the cache here
  free_[nbytes].push_back(std::move(memory));
}

ReleasableBuffer::ReleasableBuffer(int64_t numel, at::ScalarType dtype)
    : tensor_(at::empty({numel}, at::TensorOptions().dtype(dtype))),
      nbytes_(static_cast<size_t>(numel) * c10::elementSize(dtype)),
      allocated_(true) {
  release(nullptr);
}

void ReleasableBuffer::acquire(WarmMemoryPool* pool) {
  if (allocated_) return;
  c10::StorageImpl* storage = tensor_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(pool ? pool->take(nbytes_) : c10::GetCPUAllocator()->allocate(nbytes_));
  storage->set_nbytes(nbytes_);
  allocated_ = true;
}

void ReleasableBuffer::release(WarmMemoryPool* pool) {
  if (!allocated_) return;
  c10::StorageImpl* storage = tensor_.storage().unsafeGetStorageImpl();
  c10::DataPtr memory = storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
  storage->set_nbytes(0);
  if (pool) pool->give(nbytes_, std::move(memory));
  allocated_ = false;
}

at::Tensor alias_of(const at::Tensor& flat, int64_t offset, at::IntArrayRef shape) {
  return alias_of(flat, offset, shape, c10::contiguous_strides(shape));
}

at::Tensor alias_of(const at::Tensor& flat, int64_t offset, at::IntArrayRef shape, at::IntArrayRef strides) {
  at::Tensor out = at::empty({0}, flat.options());
  out.set_(flat.storage(), flat.storage_offset() + offset, shape, strides);
  return out;
}

}  // namespace hyperparallel::fsdp
