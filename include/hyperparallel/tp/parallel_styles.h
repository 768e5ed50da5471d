// Tensor-parallel styles: how one module is split over the tp axis. Each style partitions
// the module's parameters (this rank keeps its shard, in place: parameter identity and
// names are unchanged) and attaches a forward hook (nn/forward_hooks.h) that puts the
// module's input in the layout it computes on and its output in the layout the next module
// expects, with the differentiable collectives of dtensor/functional_collectives.h. This is
// the Production mode: plain local tensors, collectives only at module boundaries.
//
//   ColwiseParallel     Linear: weight rows (and bias) sharded, output features sharded
//   RowwiseParallel     Linear: weight columns sharded, partial output reduced (all-reduce,
//                       or reduce-scatter over the sequence with sequence parallelism), bias
//                       added once after the reduction; Embedding: vocab rows sharded
//   SequenceParallel    norms on a sharded input (sequence, or heads for q/k norms): the
//                       replicated weight's gradient is summed over tp
//   PrepareModuleInput  a block's input redistributed once for all its projections
//   PrepareModuleOutput a module's output redistributed for the next (the head's input)
//   ReplicatedKvHeads   k/v projections when tp exceeds the kv heads (GQA)
//   NoParallel          a replicated module whose output may be sharded (sequence parallel entry)
// Layouts are placements on the tp axis; Shard(-1) means the last dim. docs/tp.md has the
// gradient of every boundary and the plans for each model.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "hyperparallel/dtensor/dtensor_spec.h"
#include "hyperparallel/dtensor/placement.h"
#include "hyperparallel/mesh/device_mesh.h"

namespace torch::nn {
class Module;
}

namespace hyperparallel::tp {

// What the hooks of one parallelize_module call share: the tp mesh, and the global length of
// each dim that a hook sharded (so an uneven sequence is gathered back to its true length).
// A plan whose forward gathers a dim it did not shard first sums the ranks' lengths (one small
// all-reduce); a plan that shards a dim in one forward and not in the next would read the
// earlier length — the shipped plans shard the sequence first in every forward.
struct TensorParallelContext {
  explicit TensorParallelContext(mesh::DeviceMesh tp_mesh);
  mesh::DeviceMesh mesh;
  std::shared_ptr<comm::Communicator> group;
  std::map<int64_t, int64_t> sharded_dim_sizes;  // dim -> global length
  // Validation mode (tp/placement_checks.h): every boundary's placement is measured and checked.
  bool validate_placement = false;
  // A pipeline stage's model: its input may arrive sequence-sharded from the previous stage, so
  // no earlier shard of this forward recorded the length; it is always summed over the ranks.
  bool pipeline_stage = false;
  std::map<std::string, std::string> styles;  // module path -> the plan's styles for it, for messages
  // The global length of `dim` for a local tensor sharded on it.
  int64_t global_size(const at::Tensor& local, int64_t dim) const;
};

// Parameter name -> its layout on the tp mesh after parallelize_module.
using ParameterLayouts = std::map<std::string, dtensor::DTensorSpec>;

class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  // Partitions the parameters of `module` (full name `path`), attaches its hook, and records
  // the parameters' layouts. Throws UserError naming `path` when the module is not of a kind
  // the style supports.
  virtual void apply(torch::nn::Module& module, const std::string& path, std::shared_ptr<TensorParallelContext> ctx,
                     ParameterLayouts& layouts) const = 0;
  virtual std::string name() const = 0;
};

struct ColwiseParallel : ParallelStyle {
  dtensor::Placement input_layout = dtensor::Replicate();
  dtensor::Placement output_layout = dtensor::Shard(-1);
  // A replicated input's gradient is summed over tp here (Megatron's "f"). False when a
  // PrepareModuleInput of the enclosing block already does it once for all projections.
  bool reduce_input_grad = true;
  void apply(torch::nn::Module& module, const std::string& path, std::shared_ptr<TensorParallelContext> ctx,
             ParameterLayouts& layouts) const override;
  std::string name() const override { return "ColwiseParallel"; }
};

struct RowwiseParallel : ParallelStyle {
  dtensor::Placement input_layout = dtensor::Shard(-1);
  dtensor::Placement output_layout = dtensor::Replicate();
  void apply(torch::nn::Module& module, const std::string& path, std::shared_ptr<TensorParallelContext> ctx,
             ParameterLayouts& layouts) const override;
  std::string name() const override { return "RowwiseParallel"; }
};

struct SequenceParallel : ParallelStyle {
  int64_t sequence_dim = 1;
  // Shard(sequence_dim): the input arrives sharded (the residual stream under sequence
  // parallelism, or head-sharded q/k). Replicate: the hook takes this rank's piece.
  dtensor::Placement input_layout = dtensor::Shard(1);
  dtensor::Placement output_layout = dtensor::Shard(1);  // or Replicate(): gathered
  void apply(torch::nn::Module& module, const std::string& path, std::shared_ptr<TensorParallelContext> ctx,
             ParameterLayouts& layouts) const override;
  std::string name() const override { return "SequenceParallel"; }
};

struct PrepareModuleInput : ParallelStyle {
  dtensor::Placement input_layout = dtensor::Replicate();
  dtensor::Placement desired_input_layout = dtensor::Replicate();
  void apply(torch::nn::Module& module, const std::string& path, std::shared_ptr<TensorParallelContext> ctx,
             ParameterLayouts& layouts) const override;
  std::string name() const override { return "PrepareModuleInput"; }
};

// A module's output moved to the layout the next module computes on: Shard(d) -> Replicate
// is an all-gather, Replicate -> Replicate nothing; with `reduce_output_grad` (the output
// feeds sharded work, e.g. a column-parallel head) the gradient is summed over tp (the
// all-gather's dual becomes a reduce-scatter, the identity's an all-reduce).
struct PrepareModuleOutput : ParallelStyle {
  dtensor::Placement output_layout = dtensor::Replicate();
  dtensor::Placement desired_output_layout = dtensor::Replicate();
  bool reduce_output_grad = true;
  void apply(torch::nn::Module& module, const std::string& path, std::shared_ptr<TensorParallelContext> ctx,
             ParameterLayouts& layouts) const override;
  std::string name() const override { return "PrepareModuleOutput"; }
};

// GQA with more tp ranks than kv heads: the k or v projection stays whole, and each rank
// keeps the one kv head its query heads use (query heads are split evenly, tp divides them
// and is a multiple of the kv heads). Its weight's gradient is summed over tp.
struct ReplicatedKvHeads : ParallelStyle {
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  void apply(torch::nn::Module& module, const std::string& path, std::shared_ptr<TensorParallelContext> ctx,
             ParameterLayouts& layouts) const override;
  std::string name() const override { return "ReplicatedKvHeads"; }
};

// A module computed whole on every tp rank (replicated work): its input gathered when it
// arrives sharded (the gradient then a slice: every rank computes the same), its output kept
// or sliced (the sequence-parallel entry, or the exit of a replicated block).
struct NoParallel : ParallelStyle {
  dtensor::Placement input_layout = dtensor::Replicate();
  dtensor::Placement output_layout = dtensor::Replicate();
  void apply(torch::nn::Module& module, const std::string& path, std::shared_ptr<TensorParallelContext> ctx,
             ParameterLayouts& layouts) const override;
  std::string name() const override { return "NoParallel"; }
};

}  // namespace hyperparallel::tp
