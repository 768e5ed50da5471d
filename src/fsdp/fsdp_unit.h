// FSDPUnit: the parameters one fully_shard call groups, their flat buffers, their
// collectives, and the hooks that drive them through forward and backward.
//
// Buffers (docs/fsdp.md "Buffers"), for parameters p_k sharded on dim 0 over N ranks with
// block_k = ceil(dim0_k / N) * (numel_k / dim0_k) elements per rank:
//   sharded_         [sum_k block_k]      this rank's rows of every parameter (fp32 master)
//   sharded_grad_    [sum_k block_k]      reduced gradients; each p.grad aliases its rows
//                                         (allocated at the first backward: until then no
//                                         p.grad, as in PyTorch, and no memory)
//   unsharded_       [N * sum_k block_k]  the all-gather output in blocked layout: p_k is
//                                         contiguous there, so the full p_k is an alias
//   unsharded_grad_  same layout          backward accumulates here; one reduce-scatter
//   reduced_         [sum_k block_k]      the reduction's output where sharded_grad_ keeps
//                                         earlier steps' gradients (GradPath below)
// On one rank (local_) the shards are the full parameters and their gradients: neither
// unsharded buffer is used.
// Parameters alias the buffers (set_data with non-view tensors): they keep their identity,
// and an optimizer's zero_grad() works on them.
// States: SHARDED (p aliases sharded_; unsharded_ released) <-> UNSHARDED (p aliases
// unsharded_). transition() asserts every change. Cross-unit scheduling (prefetch, the end
// of backward) belongs to FSDPRoot (fsdp_root.h).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flat_buffers.h"
#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/fsdp/module_hooks.h"
#include "hyperparallel/platform/trace.h"

namespace hyperparallel::fsdp {

class FSDPRoot;

// A parameter sharded on `shard_dim`: the buffers hold it with that dim moved to the front
// (so each rank's piece is contiguous rows), and views swap it back with strides.
struct ShardedParam {
  std::string name;  // relative to its module
  size_t module_index = 0;  // which of the unit's modules registers it
  at::Tensor param;  // the module's parameter (identity kept)
  std::vector<int64_t> shape;  // full shape
  int64_t shard_dim = 0;
  int64_t dim0 = 1;              // size of the shard dim
  int64_t row_numel = 1;         // elements per slice of the shard dim
  int64_t block = 0;             // per-rank elements, padded
  int64_t local_rows = 0;        // valid rows on this rank
  int64_t shard_offset = 0;      // in sharded_ / sharded_grad_
  int64_t unsharded_offset = 0;  // in unsharded_ / unsharded_grad_
  bool grad_ready = false;

  // `rows` slices of the shard dim starting at element `offset` of `flat`, in the
  // parameter's layout (strided when shard_dim > 0; never an autograd view).
  at::Tensor view_of(const at::Tensor& flat, int64_t offset, int64_t rows) const;
  // `t` (parameter layout) as a flat row-major tensor of its shard-dim slices.
  at::Tensor rows_of(const at::Tensor& t) const;
};

struct UnitSettings {
  bool requires_gradient_sync = true;
  std::optional<double> gradient_scaling_factor;
  comm::ReduceOp reduce_op = comm::ReduceOp::kAvg;
  bool reshard_after_forward = true;
  bool reshard_after_backward = true;
  int post_forward_group = 0;  // k of reshard_after_forward = k; 0 = not used
  bool comm_fusion = true;
  int forward_prefetch_depth = 1;
  int backward_prefetch_depth = 1;
  std::optional<std::vector<FSDPUnit*>> forward_prefetch;   // explicit lists
  std::optional<std::vector<FSDPUnit*>> backward_prefetch;
};

class FSDPUnit : public ModuleHooks, public std::enable_shared_from_this<FSDPUnit> {
 public:
  using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
  // `params` are sharded over shard_comm; `replicated` stay whole, their gradients all-reduced
  // over dp_comm (every data-parallel rank). replicate_comm: HSDP's replica axis, or null.
  // One unit over `modules` (one, or a list that forms one unit); `params` and `replicated`
  // come with the index of the module that registers each.
  struct Param {
    std::string name;
    at::Tensor tensor;
    size_t module_index;
  };
  FSDPUnit(std::vector<torch::nn::Module*> modules, std::vector<Param> params, NamedTensors replicated,
           std::shared_ptr<comm::Communicator> shard_comm, std::shared_ptr<comm::Communicator> replicate_comm,
           std::shared_ptr<comm::Communicator> dp_comm, const FullyShardOptions& options);

  const mesh::DeviceMesh& mesh() const { return mesh_; }
  void pre_forward() override;
  at::Tensor cast_input(at::Tensor input) override;
  at::Tensor post_forward(at::Tensor output) override;

  void unshard_async();  // issue the all-gather (prefetch); no-op when unsharded or in flight
  void issue_unshard();  // unshard() without the wait: a stale gather in flight is issued again
  void unshard();        // finish (or do) the all-gather and point parameters at it
  void reshard();  // also drops an all-gather issued and never waited for
  // Called by the root at the end of every backward, in two passes over all units.
  void finish_reduce_scatter();
  void finish_backward();
  // Its gradients were reduced since its last forward: the optimizer may step its shards next,
  // so a gather now could read the shards before that step; prefetch leaves it alone until the
  // root's next forward starts a step (an optimizer's in-place update through p.data(), as
  // LibTorch's SGD does, leaves the version counters the stale check reads untouched).
  bool reduced_since_forward() const { return reduced_since_forward_; }
  void start_step() { reduced_since_forward_ = false; }

  UnitState state() const { return state_; }
  TrainingState training_state() const { return training_state_; }
  bool is_root() const { return is_root_; }
  UnitSettings& settings() { return settings_; }
  const std::vector<ShardedParam>& params() const { return params_; }
  const std::vector<torch::nn::Module*>& modules() const { return modules_; }
  int64_t sharded_numel() const { return sharded_.numel(); }
  int64_t unsharded_numel() const { return sharded_.numel() * shard_comm_->size(); }
  FSDPRoot* root() const { return root_.get(); }
  int global_rank() const { return shard_comm_->global_rank(); }
  int shard_size() const { return shard_comm_->size(); }  // ranks each parameter is sharded over
  void join_root(std::shared_ptr<FSDPRoot> root, bool is_root);
  // Spans of this unit's forward and backward compute, and of its collectives.
  void set_trace(std::shared_ptr<platform::TraceRecorder> trace);

  // Units in the subtrees of this unit's modules (itself first), each once.
  std::vector<FSDPUnit*> units_below();
  // The full fp32 master of every parameter (collective; the unit's state is unchanged).
  std::vector<at::Tensor> gather_full_masters();
  const NamedTensors& replicated() const { return replicated_; }
  // This rank's rows of parameter i, and loading them (the unit must be SHARDED).
  ShardedTensor local_shard(size_t i) const;
  int64_t first_row(size_t i) const;  // of parameter i's shard dim held here
  void load_local_rows(size_t i, const at::Tensor& rows);
  void load_full(size_t i, const at::Tensor& full);
  // Mixed precision: the fp32 masters are a buffer of their own (fully_shard.h
  // place_master_shards moves them into `storage`; `release` after each compute-shard cast).
  bool has_separate_masters() const { return param_dtype_ != at::kFloat; }
  void place_masters(at::Tensor storage, std::function<void(const at::Tensor&)> release);

 private:
  // The asserted transition of training_state_ (a logic_error names the unit otherwise).
  void enter(std::initializer_list<TrainingState> from, TrainingState to);
  bool in_backward() const;  // PRE_BACKWARD or POST_BACKWARD
  int64_t shard_version() const;
  // Waits for an all-gather in flight and frees its result (it is not used).
  void drop_pending_gather();
  mesh::DeviceMesh mesh_;
  void pre_backward();
  void on_grad_ready(size_t index);
  void issue_reduce_scatter();
  void register_grad_hooks();
  void point_params_at_sharded();
  // Where a step's gradients go: kReduceThenAdd reduces into reduced_ and adds that to the
  // shard gradients (which may hold earlier steps' sums); kReduceIntoShards reduces straight
  // into sharded_grad_ (its contents are dead: every gradient was set to none); with local_,
  // kAccumulateInShards lets backward accumulate into sharded_grad_ itself.
  enum class GradPath { kReduceThenAdd, kReduceIntoShards, kAccumulateInShards };
  GradPath choose_grad_path() const;
  void ensure_grad_buffers();  // sharded_grad_ on first use, reduced_ when the path needs it
  const at::Tensor& full_params() const;      // what unsharded parameters alias
  const at::Tensor& full_grads() const;       // what gradients accumulate into in backward
  const at::Tensor& reduction_output() const;  // the reduce-scatter's output
  // Parameters back to their shards; the full-parameter memory to the pool.
  void release_unsharded();
  WarmMemoryPool* pool() const;  // the root's, or none before the first forward
  void transition(UnitState from, UnitState to);

  std::vector<torch::nn::Module*> modules_;
  size_t forwards_done_ = 0;  // of modules_ this step: a list unit reshards after the last
  bool recomputing_ = false;  // this forward runs inside backward (activation recompute)
  bool reduced_since_forward_ = false;
  std::shared_ptr<comm::Communicator> shard_comm_;
  std::shared_ptr<comm::Communicator> replicate_comm_;  // HSDP only
  std::shared_ptr<comm::Communicator> dp_comm_;         // every data-parallel rank
  NamedTensors replicated_;
  std::vector<comm::CommHandle> pending_replicated_;
  UnitSettings settings_;
  std::vector<ShardedParam> params_;
  std::vector<int64_t> blocks_;
  UnitState state_ = UnitState::kSharded;
  MixedPrecisionPolicy mp_;
  at::ScalarType param_dtype_ = at::kFloat;   // what all-gathers move and modules compute in
  at::ScalarType reduce_dtype_ = at::kFloat;  // what reduce-scatters move

  at::Tensor sharded_, sharded_grad_;  // fp32 masters and their gradients
  // The shard on the compute device in param_dtype_, staged before each all-gather; used
  // with mixed precision or offload (there sharded_ / sharded_grad_ are the host copies).
  at::Tensor device_shard_;
  int64_t device_shard_version_ = -1;  // shard_version() device_shard_ was cast at
  std::function<void(const at::Tensor&)> release_masters_;  // after each cast, when placed
  bool offload_ = false;
  at::Tensor reduced_;                 // reduce-scatter output, reduce_dtype_ (kReduceThenAdd only)
  // One rank, nothing replicated, fp32, no offload: full parameters alias the shards and
  // gradients accumulate in the shard gradients; no collective runs.
  bool local_ = false;
  GradPath grad_path_ = GradPath::kReduceThenAdd;  // of the accumulation in progress
  bool reduce_issued_ = false;                      // this backward's reduction is in flight
  ReleasableBuffer unsharded_, unsharded_grad_;  // param_dtype_
  ReleasableBuffer reduce_input_;      // unsharded_grad_ cast to reduce_dtype_ (when they differ)
  // reshard_after_forward = k: after forward this rank keeps pieces [j*N/k, (j+1)*N/k) of
  // every parameter's block (j = its place in its group of k); backward all-gathers them
  // within the group.
  ReleasableBuffer post_forward_;
  std::shared_ptr<comm::Communicator> post_forward_comm_;
  std::vector<int64_t> post_forward_blocks_;
  void reshard_post_forward();
  std::vector<comm::CommHandle> pending_gather_;
  // shard_version() when pending_gather_ was issued: a gather issued before the shards changed
  // (an optimizer step, a load) carries stale parameters and is issued again.
  int64_t gather_version_ = 0;
  std::vector<comm::CommHandle> pending_reduce_;
  std::optional<comm::CommHandle> pending_replicate_;
  // One per parameter (null when it needs no gradient); kept alive so their hooks fire. A
  // dtype change in set_data makes autograd create a new accumulator: re-hooked per forward.
  std::vector<std::shared_ptr<torch::autograd::Node>> grad_accumulators_;
  size_t grads_needed_ = 0;
  size_t grads_ready_ = 0;
  TrainingState training_state_ = TrainingState::kIdle;
  bool accumulating_ = false;  // unsharded_grad_ holds gradients of unsynced backwards

  bool is_root_ = false;
  std::shared_ptr<FSDPRoot> root_;  // shared by the units of one root; null before forward

  std::shared_ptr<platform::TraceRecorder> trace_;
  std::string label_;  // the module path, set by the root (for traces)
  platform::TraceRecorder::Clock::time_point forward_started_, backward_started_;
};

// Every unit under `root`, once each, in module order (the same on every rank), and the path
// of every module under `root` (to name a unit's parameters by their own module).
struct UnitsAndPaths {
  std::vector<FSDPUnit*> units;
  std::map<const torch::nn::Module*, std::string> paths;
  std::string key(const FSDPUnit& unit, const ShardedParam& sp) const {
    const std::string& path = paths.at(unit.modules()[sp.module_index]);
    return path.empty() ? sp.name : path + "." + sp.name;
  }
};
UnitsAndPaths units_under(torch::nn::Module& root);

}  // namespace hyperparallel::fsdp
