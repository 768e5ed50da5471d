#include "hyperparallel/dtensor/dtensor.h"

#include <ATen/ATen.h>

#include "hyperparallel/platform/user_error.h"
#include "redistribute_function.h"

namespace hyperparallel::dtensor {
namespace {

AxisGroups axis_groups(const mesh::DeviceMesh& mesh) {
  AxisGroups groups;
  for (const auto& name : mesh.axis_names()) groups.comms.push_back(mesh.comm(name));
  return groups;
}

}  // namespace

DTensor::DTensor(at::Tensor local, DTensorSpec spec) : local_(std::move(local)), spec_(std::move(spec)) {
  const std::vector<int64_t> want = spec_.local_shape();
  if (local_.sizes().vec() != want) {
    throw UserError("DTensor: the local tensor has shape " + shape_string(local_.sizes().vec()) + " but " +
                    spec_.to_string() + " gives this rank " + shape_string(want));
  }
}

DTensor DTensor::from_local(at::Tensor local, const mesh::DeviceMesh& mesh, Placements placements,
                            std::optional<std::vector<int64_t>> global_shape) {
  check_placements(placements, local.dim(), mesh.ndim(), "DTensor::from_local on " + mesh.to_string());
  std::vector<int64_t> shape = global_shape.value_or(local.sizes().vec());
  if (!global_shape) {
    for (size_t axis = 0; axis < placements.size(); ++axis) {
      if (placements[axis].is_shard()) shape[placements[axis].dim()] *= mesh.shape()[axis];
    }
  }
  return DTensor(std::move(local), DTensorSpec(mesh, std::move(placements), std::move(shape)));
}

DTensor DTensor::redistribute(const Placements& placements, const RedistributeOptions& options) const {
  DTensorSpec target = spec_.with_placements(placements);  // validates
  if (placements == spec_.placements() && !options.grad_placements) return *this;
  RedistributeCall call{axis_groups(spec_.mesh()), spec_.global_shape(), spec_.placements(), placements,
                        options.grad_placements};
  return DTensor(redistribute_differentiable(local_, std::move(call)), std::move(target));
}

at::Tensor DTensor::full_tensor() const {
  return redistribute(Placements(spec_.placements().size(), Replicate())).to_local();
}

DTensor distribute_tensor(const at::Tensor& full, const mesh::DeviceMesh& mesh, const Placements& placements) {
  DTensor replicated(full, DTensorSpec(mesh, Placements(mesh.ndim(), Replicate()), full.sizes().vec()));
  return replicated.redistribute(placements);
}

}  // namespace hyperparallel::dtensor
