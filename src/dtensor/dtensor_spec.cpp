#include "hyperparallel/dtensor/dtensor_spec.h"

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::dtensor {

DTensorSpec::DTensorSpec(mesh::DeviceMesh mesh, Placements placements, std::vector<int64_t> global_shape)
    : mesh_(std::move(mesh)), placements_(std::move(placements)), global_shape_(std::move(global_shape)) {
  for (int64_t s : global_shape_) {
    if (s < 0) throw UserError("DTensorSpec: global shape " + shape_string(global_shape_) + " has a negative size");
  }
  check_placements(placements_, static_cast<int64_t>(global_shape_.size()), mesh_.ndim(),
                   "DTensorSpec on " + mesh_.to_string());
}

Box DTensorSpec::local_box() const { return box_of(mesh_.coordinates()); }

Box DTensorSpec::box_of(const std::vector<int64_t>& mesh_coords) const {
  return dtensor::local_box(global_shape_, placements_, mesh_.shape(), mesh_coords);
}

DTensorSpec DTensorSpec::with_placements(Placements placements) const {
  return DTensorSpec(mesh_, std::move(placements), global_shape_);
}

std::string DTensorSpec::to_string() const {
  return "DTensorSpec(" + mesh_.to_string() + ", " + dtensor::to_string(placements_) + ", global " +
         shape_string(global_shape_) + ")";
}

}  // namespace hyperparallel::dtensor
