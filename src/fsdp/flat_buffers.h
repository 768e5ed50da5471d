// Flat buffers for FSDP units and the memory behind them.
//
// WarmMemoryPool keeps released memory for the next unit of the same size: first touches of
// fresh pages cost ~3 ms/MiB on these machines, and a unit's full-parameter buffer is
// released and re-acquired twice per step. The pool holds at most what was live at once,
// so the bound on live unsharded units still bounds memory. Where the process runs the
// caching host allocator (platform/host_allocator.h) the pool holds nothing: that cache
// already keeps the pages warm, and serves them to requests of any size (memory parked here
// could serve only the next unit of the same size).
// ReleasableBuffer is a flat tensor whose memory can be released and re-acquired in place:
// every tensor sharing its storage (parameter aliases, views autograd saved in forward)
// follows the new memory — the C++ form of FSDP2's storage resize.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <vector>

namespace hyperparallel::fsdp {

class WarmMemoryPool {
 public:
  c10::DataPtr take(size_t nbytes);
  void give(size_t nbytes, c10::DataPtr memory);

 private:
  std::map<size_t, std::vector<c10::DataPtr>> free_;
};

class ReleasableBuffer {
 public:
  ReleasableBuffer() = default;
  ReleasableBuffer(int64_t numel, at::ScalarType dtype);  // starts released
  const at::Tensor& tensor() const { return tensor_; }
  bool allocated() const { return allocated_; }
  void acquire(WarmMemoryPool* pool);  // contents undefined
  void release(WarmMemoryPool* pool);  // aliases must not be read until the next acquire

 private:
  at::Tensor tensor_;
  size_t nbytes_ = 0;
  bool allocated_ = false;
};

// A tensor of `shape` over `flat`'s storage from element `offset`; shares the storage but
// is not an autograd view, so optimizers can detach_() and zero_() it.
at::Tensor alias_of(const at::Tensor& flat, int64_t offset, at::IntArrayRef shape);
at::Tensor alias_of(const at::Tensor& flat, int64_t offset, at::IntArrayRef shape, at::IntArrayRef strides);

}  // namespace hyperparallel::fsdp
