// OptimizerStateFile: optimizer state in a file-backed shared mapping instead of anonymous
// memory, streamed in and out of this process's resident set one tensor at a time.
//
// The file (on fast local disk, e.g. NVMe) is created, sized, mapped MAP_SHARED and unlinked
// at once, so nothing is left behind however the process ends. Tensors are fp32 views of the
// mapping, each starting on its own page. Around an update the optimizer calls will_need() on
// the next tensor (madvise WILLNEED: the kernel reads it ahead) and release() on the one it
// just wrote (MADV_DONTNEED on a shared mapping: the pages leave this process's resident set
// and stay in the file and page cache, from where the next step faults them back). Resident
// optimizer memory is then the tensors being updated, not all of them; the kernel may evict
// the rest of the file's pages to disk under memory pressure. The numbers are those of the
// same arithmetic in memory (bit-identical: the data only lives elsewhere). Counters: bytes
// released and bytes faulted back, for the memory benchmark and tests.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hyperparallel::optim {

class OptimizerStateFile {
 public:
  // A file in `dir` (created, then unlinked) of room for `numels` fp32 tensors, page-aligned
  // each. UserError naming the directory when it cannot be created or sized.
  OptimizerStateFile(const std::string& dir, const std::vector<int64_t>& numels);
  ~OptimizerStateFile();
  OptimizerStateFile(const OptimizerStateFile&) = delete;
  OptimizerStateFile& operator=(const OptimizerStateFile&) = delete;

  // The k-th tensor (zeros the first time) with `sizes` (numel as given at construction).
  at::Tensor tensor(size_t k, at::IntArrayRef sizes) const;
  void will_need(size_t k) const;
  void release(size_t k);
  // The same by address, for tensors that live inside the mapping (views of its tensors, such
  // as parameters aliasing fp32 master shards placed here): whole pages around `t`'s bytes.
  // Releasing a neighbour's pages too is harmless (shared file pages come back on access).
  bool holds(const at::Tensor& t) const;
  void will_need(const at::Tensor& t) const;
  void release(const at::Tensor& t);
  uint64_t bytes() const { return bytes_; }
  uint64_t released_bytes() const { return released_; }

 private:
  std::vector<uint64_t> offsets_, lengths_;
  uint64_t bytes_ = 0, released_ = 0;
  char* base_ = nullptr;
};

}  // namespace hyperparallel::optim
