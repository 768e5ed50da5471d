// fully_shard: shard a module's parameters over the ranks of a mesh (FSDP).
//
// Apply bottom-up: each decoder layer, then the root. Each call makes one *unit*: the
// parameters of the module that no unit below it already owns. After fully_shard:
//  - each parameter keeps its identity (module members and optimizers built afterwards see
//    the same tensors) but holds only this rank's rows of dim 0 — ceil(dim0 / N) rows, the
//    padding invisible — so any torch::optim optimizer keeps state for local shards only;
//  - a unit's local shards live in one flat buffer (the parameters alias it); forward and
//    backward all-gather the unit in one collective into one flat buffer that the full
//    parameters alias (no per-parameter copy-out); gradients accumulate into one flat buffer
//    and one reduce-scatter, issued as soon as the unit's gradients are complete, averages
//    them into the flat sharded-gradient buffer that the parameters' .grad alias.
// Each unit is a state machine (docs/fsdp.md "States"): SHARDED -> UNSHARDED -> SHARDED, or
// UNSHARDED -> SHARDED_POST_FORWARD -> UNSHARDED with reshard_after_forward = k.
// A module takes part through hyperparallel::fsdp::hooked_forward (module_hooks.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "hyperparallel/comm/comm_counters.h"
#include "hyperparallel/dtensor/placement.h"
#include "hyperparallel/mesh/device_mesh.h"

namespace torch::nn {
class Module;
}

namespace hyperparallel::fsdp {

// Compute in param_dtype (all-gathers move it), reduce gradients in reduce_dtype, keep fp32
// master shards for the optimizer. Unset dtypes mean fp32 / param_dtype / unchanged.
struct MixedPrecisionPolicy {
  std::optional<at::ScalarType> param_dtype;
  std::optional<at::ScalarType> reduce_dtype;
  std::optional<at::ScalarType> output_dtype;  // cast the module's output
  bool cast_forward_inputs = true;             // cast floating inputs to param_dtype
};

// Keep sharded parameters and gradients in host memory; each unit's shard moves to the
// compute device right before its all-gather and reduced gradients move back. With a CPU
// compute device (this build) the path still runs: a staging copy per all-gather.
// pin_memory applies to CUDA builds only.
struct OffloadPolicy {
  bool cpu_offload = false;
  bool pin_memory = true;
};
struct CPUOffloadPolicy : OffloadPolicy {
  explicit CPUOffloadPolicy(bool pin = true) {
    cpu_offload = true;
    pin_memory = pin;
  }
};

struct FullyShardOptions {
  // The ranks to shard over. 1-D: FSDP over its ranks. 2-D (replicate, shard): HSDP — shard over the second axis, replicate over the
  // first; gradients are reduce-scattered within a shard group, then all-reduced across
  // replicas. Empty: the mesh of the units already sharded below (so with bottom-up
  // application only the first call names it); a UserError when there are none — there is
  // no global default process group to fall back on.
  std::optional<mesh::DeviceMesh> mesh;
  // After forward: true frees the full parameters (all-gather again in backward); false
  // keeps them; an int k (a divisor of the shard-group size, 1 < k < size) keeps them
  // sharded over groups of k consecutive ranks, so backward's all-gather stays within the
  // group (e.g. within a node) and moves 1/k of the data per rank.
  std::variant<bool, int> reshard_after_forward = true;
  // One collective per unit (true) or one per parameter (false: the slow path, for comparison).
  bool comm_fusion = true;
  // How many units ahead (in the recorded forward order) to all-gather while one computes;
  // in backward the same in reverse order. 0 turns prefetching off.
  int forward_prefetch_depth = 1;
  int backward_prefetch_depth = 1;
  MixedPrecisionPolicy mp_policy;
  OffloadPolicy offload_policy;
  // The dim to shard each parameter on (given its name within the module); nullopt or no
  // function: dim 0. Any dim works without copies: the buffers hold that dim first and the
  // parameter is a strided view of them.
  std::function<std::optional<int64_t>(const std::string& name, const at::Tensor& param)> shard_placement_fn;
  // Left alone: not sharded, no gradient synchronisation (e.g. frozen parameters).
  std::vector<at::Tensor> ignored_params;
  // Managed but not sharded: full on every rank, gradients all-reduced (avg) over the mesh
  // like DDP — for small parameters where sharding costs more than it saves.
  std::vector<at::Tensor> replicate_params;
};

// One rank's piece of a parameter. `global_shape` and the box (`offsets`, `lengths` per dim)
// place it in the whole tensor, whatever split it (FSDP rows of a tensor-parallel piece,
// dtensor/parameter_specs.h). `shard_dim` and `row_offset` say where FSDP cut this rank's
// tensor-parallel piece (the whole tensor without TP): rows [row_offset, row_offset +
// local.size(shard_dim)).
struct ShardedTensor {
  at::Tensor local;
  std::vector<int64_t> global_shape;
  int64_t row_offset = 0;
  int64_t shard_dim = 0;
  std::vector<int64_t> offsets, lengths;
};

enum class UnitState { kSharded, kUnsharded, kShardedPostForward };
const char* to_string(UnitState state);

// Where a unit is in a training step (docs/fsdp.md "States"): IDLE -> FORWARD (pre-forward
// to post-forward) -> IDLE -> PRE_BACKWARD (its outputs' gradients arrived, its parameters'
// are accumulating) -> POST_BACKWARD (its gradients are complete and being reduced) -> IDLE
// (the root's end of backward).
enum class TrainingState { kIdle, kForward, kPreBackward, kPostBackward };
const char* to_string(TrainingState state);

class FSDPUnit;  // src/fsdp/fsdp_unit.h

// An all-gather issued by FSDPModule::unshard(); the unit's parameters are full after wait().
class UnshardHandle {
 public:
  explicit UnshardHandle(std::shared_ptr<FSDPUnit> unit) : unit_(std::move(unit)) {}
  void wait();

 private:
  std::shared_ptr<FSDPUnit> unit_;
};

// The handle fully_shard returns; the unit itself lives on the module (module_hooks.h).
class FSDPModule {
 public:
  explicit FSDPModule(std::shared_ptr<FSDPUnit> unit) : unit_(std::move(unit)) {}
  UnitState state() const;
  TrainingState training_state() const;
  UnshardHandle unshard();  // issue the all-gather now; wait() on the handle to use the parameters
  void reshard();  // free the full parameters

  // Runtime settings; each applies to this unit and every unit below it.
  // Off: backward accumulates full gradients locally, with no communication; the next
  // backward with sync on reduces the sum.
  void set_requires_gradient_sync(bool sync);
  // Multiply reduced gradients by `factor` (after the avg or sum); nullopt: no scaling.
  void set_gradient_scaling_factor(std::optional<double> factor);
  void set_reduce_op_type(const std::string& op);  // "avg" (default) or "sum"
  void set_reshard_after_forward(bool reshard);
  // Off: keep full parameters after a backward without gradient sync (skips the next
  // forward's all-gather during accumulation). A synced backward always reshards, since the
  // optimizer steps on shards.
  void set_reshard_after_backward(bool reshard);
  // Explicit prefetch targets, replacing the depth-based choice for this unit.
  void set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules);
  void set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules);
  // Most units holding full parameters at once since the last reset (the root excluded).
  int max_live_unsharded_units() const;
  void reset_max_live_unsharded_units();
  // Record forward/backward compute spans of this unit and the units below, and their
  // collectives (platform/trace.h); null stops recording.
  void set_trace(std::shared_ptr<platform::TraceRecorder> trace);
  int64_t sharded_numel() const;    // elements of the local flat shard (with padding)
  int64_t unsharded_numel() const;  // elements of the all-gather buffer (with padding)
  size_t unit_param_count() const;  // parameters this unit manages
  const std::shared_ptr<FSDPUnit>& unit() const { return unit_; }

 private:
  std::shared_ptr<FSDPUnit> unit_;
};

FSDPModule fully_shard(torch::nn::Module& module, const FullyShardOptions& options);
// One unit over several modules (e.g. a few small layers): all-gathered when the first of
// them runs forward, resharded after the last.
FSDPModule fully_shard(const std::vector<torch::nn::Module*>& modules, const FullyShardOptions& options);

// Every parameter of `root` by its full name, unsharded (padding removed), from the fp32
// masters, on every rank; tensor-parallel pieces gathered too. Collective over each unit's
// ranks and the tp ranks.
std::map<std::string, at::Tensor> full_parameters(torch::nn::Module& root);

// State dicts, keyed by the parameters' full names. Sharded: this rank's rows of every
// sharded parameter (replicated and unmanaged parameters whole, row_offset 0). Full: every
// parameter unsharded (on every rank, or only on rank 0 when rank0_only — still collective).
std::map<std::string, ShardedTensor> sharded_state_dict(torch::nn::Module& root);
std::map<std::string, at::Tensor> full_state_dict(torch::nn::Module& root, bool rank0_only = false);
// Loading checks names and shapes first (UserError listing missing and unexpected keys or the
// mismatching shape) and changes nothing on error. A full state dict can come from any layout.
void load_sharded_state_dict(torch::nn::Module& root, const std::map<std::string, ShardedTensor>& state);
void load_full_state_dict(torch::nn::Module& root, const std::map<std::string, at::Tensor>& state);

// Where mixed precision's fp32 master shards live (optimizer offload keeps them in its
// file-backed mapping). Units under `root` whose parameters are separate from what they
// compute with (param_dtype other than fp32) are moved, in module order: `allocate(k, numel)`
// gives the k-th its buffer, the masters are copied there and the parameters alias it. The
// compute-dtype shard an all-gather sends is cast from the masters only after they changed (an
// optimizer step, a load), and then `release(masters)` is called, so forwards and backwards
// leave the masters alone between optimizer steps. Every unit must be sharded and idle.
struct MasterShardPlacement {
  std::function<at::Tensor(size_t unit, int64_t numel)> allocate;
  std::function<void(const at::Tensor& masters)> release;
};
std::vector<int64_t> separate_master_numels(torch::nn::Module& root);
void place_master_shards(torch::nn::Module& root, const MasterShardPlacement& placement);

// Every parameter's full (global) shape by full name (sharded or not); no communication.
std::map<std::string, std::vector<int64_t>> full_parameter_shapes(torch::nn::Module& root);
// Loads every parameter of `root` from a reader of boxes, touching only what this rank holds:
// read(name, box) must return the box [offsets[d], offsets[d] + lengths[d]) of the full tensor
// `name` (any dtype; it is cast) — this rank's FSDP rows of its tensor-parallel piece. With
// deferred initialisation (parameters allocated but never written) no rank ever holds a whole
// model. No communication; the caller checks names and shapes first (full_parameter_shapes).
using ParameterBoxReader = std::function<at::Tensor(const std::string& name, const dtensor::Box& box)>;
void load_parameters(torch::nn::Module& root, const ParameterBoxReader& read);

}  // namespace hyperparallel::fsdp
