// DTensor: a local tensor plus the spec that says which piece of which global tensor it is.
//
// This is the Production-mode object: a DTensor holds a plain local at::Tensor that ordinary
// LibTorch ops run on at full speed; layouts change only through redistribute(), one
// autograd function whose backward is the dual redistribution (docs/dtensor.md has every
// transition and its dual). Like PyTorch's DTensor:
//   auto w = distribute_tensor(full, mesh["tp"], {Shard(0)});   // every rank holds `full`
//   auto y = DTensor::from_local(partial_sum, mesh["tp"], {Partial()});
//   at::Tensor replicated = y.redistribute({Replicate()}).to_local();
// Uneven shards are the ceil split (placement.h). from_local without a global shape assumes
// even shards (every rank's local size times the axis size), as PyTorch does; pass the shape
// for uneven ones. A DTensor is a value; copies share the local tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "hyperparallel/dtensor/dtensor_spec.h"

namespace hyperparallel::dtensor {

struct RedistributeOptions {
  // The placements the gradient of the result arrives in. Default: the result's placements
  // with Partial read as Replicate. Say Partial where the result feeds work that is sharded
  // over that axis (a replicated input to a column-parallel matmul): the backward then
  // reduces the gradient over the axis.
  std::optional<Placements> grad_placements;
};

class DTensor {
 public:
  // `local` must have the shape the spec gives this rank (UserError otherwise).
  DTensor(at::Tensor local, DTensorSpec spec);

  static DTensor from_local(at::Tensor local, const mesh::DeviceMesh& mesh, Placements placements,
                            std::optional<std::vector<int64_t>> global_shape = std::nullopt);

  const at::Tensor& to_local() const { return local_; }
  const DTensorSpec& spec() const { return spec_; }
  const Placements& placements() const { return spec_.placements(); }
  const std::vector<int64_t>& global_shape() const { return spec_.global_shape(); }
  const mesh::DeviceMesh& mesh() const { return spec_.mesh(); }

  // The same global tensor under `placements` (one per mesh axis), differentiable.
  DTensor redistribute(const Placements& placements, const RedistributeOptions& options = {}) const;
  // The whole global tensor on every rank (redistribute to Replicate on every axis).
  at::Tensor full_tensor() const;

 private:
  at::Tensor local_;
  DTensorSpec spec_;
};

// Every rank passes the same `full` tensor and keeps its piece under `placements`
// (Partial(sum): the value on the axis's first rank, zeros elsewhere). Differentiable.
DTensor distribute_tensor(const at::Tensor& full, const mesh::DeviceMesh& mesh, const Placements& placements);

}  // namespace hyperparallel::dtensor
