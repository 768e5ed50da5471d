// A data-parallel baseline built the way c10d's Reducer builds PyTorch DDP, so FSDP is
// compared with a fair peer: parameters in reverse registration order (about the order
// backward produces their gradients) are grouped into buckets of at most `bucket_bytes` (the
// first of at most 1 MiB, as c10d starts), a gradient hook copies each gradient into its
// bucket's flat buffer, and the bucket's all-reduce (average) starts as soon as its last
// gradient arrives, so it runs while backward computes the rest. finish() waits for every
// bucket and writes the averaged gradients back. Benchmark code: one step at a time, every
// parameter must get a gradient each step.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "hyperparallel/comm/communicator.h"

namespace hyperparallel::benchmarks {

class BucketedDdp {
 public:
  BucketedDdp(std::vector<at::Tensor> params, std::shared_ptr<comm::Communicator> comm, int64_t bucket_bytes = 25 << 20)
      : comm_(std::move(comm)), params_(std::move(params)) {
    std::reverse(params_.begin(), params_.end());
    int64_t cap = std::min<int64_t>(bucket_bytes, 1 << 20);
    for (size_t i = 0; i < params_.size(); ++i) {
      const int64_t bytes = params_[i].numel() * static_cast<int64_t>(params_[i].element_size());
      if (buckets_.empty() || (buckets_.back().bytes > 0 && buckets_.back().bytes + bytes > cap)) {
        if (!buckets_.empty()) cap = bucket_bytes;
        buckets_.emplace_back();
      }
      Bucket& b = buckets_.back();
      slots_.push_back({buckets_.size() - 1, b.numel});
      b.members.push_back(i);
      b.numel += params_[i].numel();
      b.bytes += bytes;
    }
    for (auto& b : buckets_) {
      b.flat = at::zeros({b.numel}, params_.front().options());
      b.pending = b.members.size();
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i].register_hook([this, i](const at::Tensor& grad) { on_gradient(i, grad); });
    }
  }

  std::vector<int64_t> bucket_numels() const {
    std::vector<int64_t> out;
    for (const auto& b : buckets_) out.push_back(b.numel);
    return out;
  }

  // After backward: every bucket's average in the parameters' gradients.
  void finish() {
    for (auto& b : buckets_) {
      if (b.pending != 0 || !b.reduction) throw std::runtime_error("BucketedDdp: a parameter got no gradient this step");
      b.reduction->wait();
      b.reduction.reset();
      for (size_t i : b.members) {
        at::Tensor& p = params_[i];
        p.mutable_grad().copy_(b.flat.narrow(0, slots_[i].offset, p.numel()).view(p.sizes()));
      }
      b.pending = b.members.size();
    }
  }

 private:
  struct Bucket {
    std::vector<size_t> members;
    int64_t numel = 0, bytes = 0;
    at::Tensor flat;
    size_t pending = 0;
    std::optional<comm::CommHandle> reduction;
  };
  struct Slot {
    size_t bucket;
    int64_t offset;
  };

  void on_gradient(size_t i, const at::Tensor& grad) {
    Bucket& b = buckets_[slots_[i].bucket];
    b.flat.narrow(0, slots_[i].offset, grad.numel()).copy_(grad.reshape({-1}));
    if (--b.pending == 0) b.reduction = comm_->all_reduce(b.flat, comm::ReduceOp::kAvg);
  }

  std::shared_ptr<comm::Communicator> comm_;
  std::vector<at::Tensor> params_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;
};

}  // namespace hyperparallel::benchmarks
