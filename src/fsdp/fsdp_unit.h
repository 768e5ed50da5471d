// FSDPUnit: the parameters one fully_shard call groups, their flat buffers, their
// collectives, and the hooks that drive them through forward and backward.
//
// Buffers (docs/fsdp.md "Buffers"), for parameters p_k sharded on dim 0 over N ranks with
// block_k = ceil(dim0_k / N) * (numel_k / dim0_k) elements per rank:
//   sharded_       [sum_k block_k]       this rank's rows of every parameter (fp32 master)
//   sharded_grad_  [sum_k block_k]       reduced gradients; each p.grad aliases its rows
//   unsharded_     [N * sum_k block_k]   the all-gather output in blocked layout: p_k is
//                                        contiguous there, so the full p_k is an alias
//   unsharded_grad_ same layout          backward accumulates here; one reduce-scatter
// Parameters alias the buffers through set_data with non-view tensors, so they keep their
// identity and an optimizer's zero_grad() works on them.
// States: SHARDED (p aliases sharded_, unsharded_ freed) <-> UNSHARDED (p aliases unsharded_).
// A root unit (the first to run forward) finds the units below it and finishes every
// backward from an autograd engine callback: it waits for the reduce-scatters and points
// the gradients back at the sharded buffer.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/fsdp/module_hooks.h"

namespace hyperparallel::fsdp {

// Memory for unsharded buffers, kept warm between uses (fresh pages cost ~3 ms/MiB here).
// Holds at most what the live units need at once, so the memory bound still holds.
class WarmMemoryPool {
 public:
  c10::DataPtr take(size_t nbytes);
  void give(size_t nbytes, c10::DataPtr memory);

 private:
  std::map<size_t, std::vector<c10::DataPtr>> free_;
};

// A flat buffer whose memory can be released and re-acquired in place: tensors sharing its
// storage (parameter aliases, views autograd saved in forward) follow the new memory.
class ReleasableBuffer {
 public:
  ReleasableBuffer() = default;
  ReleasableBuffer(int64_t numel, at::ScalarType dtype);
  const at::Tensor& tensor() const { return tensor_; }
  bool allocated() const { return allocated_; }
  void acquire(WarmMemoryPool* pool);  // allocate (contents undefined)
  void release(WarmMemoryPool* pool);  // give the memory back; aliases must not be used
  // A tensor that shares this buffer's storage (not an autograd view).
  at::Tensor alias(int64_t offset, at::IntArrayRef shape) const;

 private:
  at::Tensor tensor_;
  size_t nbytes_ = 0;
  bool allocated_ = false;
};

struct ShardedParam {
  std::string name;  // relative to the unit's module
  at::Tensor param;  // the module's parameter (identity kept)
  std::vector<int64_t> shape;  // full shape
  int64_t dim0 = 1;
  int64_t row_numel = 1;       // elements per dim-0 row
  int64_t block = 0;           // per-rank elements, padded
  int64_t local_rows = 0;      // valid rows on this rank
  int64_t shard_offset = 0;    // in sharded_ / sharded_grad_
  int64_t unsharded_offset = 0;  // in unsharded_ / unsharded_grad_
  bool grad_ready = false;
};

class FSDPUnit : public ModuleHooks, public std::enable_shared_from_this<FSDPUnit> {
 public:
  FSDPUnit(torch::nn::Module& module, std::vector<std::pair<std::string, at::Tensor>> params,
           std::shared_ptr<comm::Communicator> comm, const FullyShardOptions& options);

  void pre_forward() override;
  at::Tensor post_forward(at::Tensor output) override;

  void unshard();
  void reshard();
  UnitState state() const { return state_; }
  const std::vector<ShardedParam>& params() const { return params_; }
  torch::nn::Module& module() const { return module_; }
  int64_t sharded_numel() const { return sharded_.numel(); }
  int64_t unsharded_numel() const { return sharded_.numel() * comm_->size(); }

 private:
  void lazy_init_root();
  void pre_backward();
  void on_grad_ready(size_t index);
  void issue_reduce_scatter();
  void finish_backward();  // root only, from the engine callback
  void finish_reduce_scatter();
  void point_params_at_unsharded();
  void point_params_at_sharded();
  void transition(UnitState from, UnitState to);

  torch::nn::Module& module_;
  std::shared_ptr<comm::Communicator> comm_;
  FullyShardOptions options_;
  std::vector<ShardedParam> params_;
  std::vector<int64_t> blocks_;
  UnitState state_ = UnitState::kSharded;

  at::Tensor sharded_, sharded_grad_, reduced_;
  ReleasableBuffer unsharded_, unsharded_grad_;
  std::vector<std::shared_ptr<torch::autograd::Node>> grad_accumulators_;  // keep alive: hooks fire
  size_t grads_ready_ = 0;
  bool in_backward_ = false;
  std::optional<comm::CommHandle> pending_reduce_;

  // Root bookkeeping (set on the root unit at its first forward). Units live on their
  // modules, which live at least as long as the root module: plain pointers suffice.
  bool is_root_ = false;
  std::vector<FSDPUnit*> all_units_;      // root only; includes itself
  FSDPUnit* root_ = nullptr;              // every unit: its root (nullptr before the first forward)
  bool backward_callback_queued_ = false; // root only
  std::shared_ptr<WarmMemoryPool> pool_;  // shared by the units of one root
};

}  // namespace hyperparallel::fsdp
