// File-backed optimizer state. See optim/state_file.h.
#include "hyperparallel/optim/state_file.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::optim {
namespace {

uint64_t page_size() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }
uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

}  // namespace

OptimizerStateFile::OptimizerStateFile(const std::string& dir, const std::vector<int64_t>& numels) {
  const uint64_t page = page_size();
  for (int64_t n : numels) {
    offsets_.push_back(bytes_);
    lengths_.push_back(static_cast<uint64_t>(n) * sizeof(float));
    bytes_ += round_up(std::max<uint64_t>(lengths_.back(), 1), page);
  }
  std::string path = dir + "/hp_optimizer_state.XXXXXX";
  const int fd = mkstemp(path.data());
  const auto fail = [&](const std::string& what) {
    throw UserError("optimizer_offload.dir: cannot " + what + " in " + dir + " (" + std::strerror(errno) +
                    "); name an existing writable directory on a local disk with room for " + std::to_string(bytes_ >> 20) +
                    " MiB");
  };
  if (fd < 0) fail("create a file");
  unlink(path.c_str());  // lives while mapped; nothing is left behind
  if (ftruncate(fd, static_cast<off_t>(bytes_)) != 0 || (bytes_ > 0 && posix_fallocate(fd, 0, static_cast<off_t>(bytes_)) != 0)) {
    close(fd);
    fail("reserve the state's space");
  }
  void* mapped = bytes_ > 0 ? mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : nullptr;
  close(fd);
  if (mapped == MAP_FAILED) fail("map the state file");
  base_ = static_cast<char*>(mapped);
}

OptimizerStateFile::~OptimizerStateFile() {
  if (base_) munmap(base_, bytes_);
}

at::Tensor OptimizerStateFile::tensor(size_t k, at::IntArrayRef sizes) const {
  return at::from_blob(base_ + offsets_[k], sizes, at::TensorOptions().dtype(at::kFloat));
}

void OptimizerStateFile::will_need(size_t k) const {
  if (lengths_[k] > 0) madvise(base_ + offsets_[k], round_up(lengths_[k], page_size()), MADV_WILLNEED);
}

void OptimizerStateFile::release(size_t k) {
  if (lengths_[k] == 0) return;
  madvise(base_ + offsets_[k], round_up(lengths_[k], page_size()), MADV_DONTNEED);
  released_ += lengths_[k];
}

}  // namespace hyperparallel::optim

namespace hyperparallel::optim {

bool OptimizerStateFile::holds(const at::Tensor& t) const {
  const char* at_byte = static_cast<const char*>(t.data_ptr());
  return base_ && t.numel() > 0 && at_byte >= base_ && at_byte + t.nbytes() <= base_ + bytes_;
}

namespace {

// The whole pages covering [begin, begin + length).
std::pair<char*, uint64_t> pages_of(const at::Tensor& t) {
  const uint64_t page = sysconf(_SC_PAGESIZE) > 0 ? static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 4096;
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t first = begin / page * page, last = (begin + t.nbytes() + page - 1) / page * page;
  return {reinterpret_cast<char*>(first), static_cast<uint64_t>(last - first)};
}

}  // namespace

void OptimizerStateFile::will_need(const at::Tensor& t) const {
  if (!holds(t)) return;
  const auto [start, length] = pages_of(t);
  madvise(start, length, MADV_WILLNEED);
}

void OptimizerStateFile::release(const at::Tensor& t) {
  if (!holds(t)) return;
  const auto [start, length] = pages_of(t);
  if (madvise(start, length, MADV_DONTNEED) == 0) released_ += length;
}

}  // namespace hyperparallel::optim
