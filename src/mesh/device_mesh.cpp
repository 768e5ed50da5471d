#include "hyperparallel/mesh/device_mesh.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "hyperparallel/platform/suggest.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::mesh {
namespace {

std::string shape_string(const std::vector<int64_t>& shape, const std::vector<std::string>& names) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out << ", ";
    if (i < names.size()) out << names[i] << "=";
    out << shape[i];
  }
  out << ")";
  return out.str();
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<int64_t> coords_of(int64_t index, const std::vector<int64_t>& shape) {
  std::vector<int64_t> coords(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    coords[d] = index % shape[d];
    index /= shape[d];
  }
  return coords;
}

int64_t index_of(const std::vector<int64_t>& coords, const std::vector<int64_t>& shape) {
  int64_t index = 0;
  for (size_t d = 0; d < shape.size(); ++d) index = index * shape[d] + coords[d];
  return index;
}

void validate_layout(const std::vector<int64_t>& shape, const std::vector<std::string>& names) {
  if (shape.empty()) throw UserError("mesh shape is empty; give at least one axis, e.g. shape (4) names (dp_shard)");
  if (names.size() != shape.size()) {
    throw UserError("mesh shape has " + std::to_string(shape.size()) + " axes but " + std::to_string(names.size()) +
                    " names were given; name every axis");
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (names[i].empty()) throw UserError("mesh axis " + std::to_string(i) + " has an empty name");
    if (!seen.insert(names[i]).second) throw UserError("mesh axis name '" + names[i] + "' is used twice");
    if (shape[i] < 1) {
      throw UserError("mesh axis '" + names[i] + "' has size " + std::to_string(shape[i]) + "; sizes must be >= 1");
    }
  }
}

}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<comm::Communicator> world, std::string device_type,
                       std::vector<int64_t> shape, std::vector<std::string> names, std::vector<int> ranks)
    : world_(std::move(world)),
      device_type_(std::move(device_type)),
      shape_(std::move(shape)),
      names_(std::move(names)),
      ranks_(std::move(ranks)) {
  validate_layout(shape_, names_);
  if (static_cast<int64_t>(ranks_.size()) != product(shape_)) {
    throw UserError("mesh " + shape_string(shape_, names_) + " needs " + std::to_string(product(shape_)) +
                    " ranks, got " + std::to_string(ranks_.size()));
  }
  auto me = std::find(ranks_.begin(), ranks_.end(), world_->global_rank());
  if (me == ranks_.end()) {
    throw UserError("world rank " + std::to_string(world_->global_rank()) + " is not in mesh " +
                    shape_string(shape_, names_));
  }
  my_index_ = me - ranks_.begin();
  for (const auto& axis : names_) axis_comms_.push_back((*this)[axis].comm());
}

int64_t DeviceMesh::size() const { return product(shape_); }

int DeviceMesh::axis_index(const std::string& axis) const {
  auto it = std::find(names_.begin(), names_.end(), axis);
  if (it == names_.end()) {
    throw UserError("mesh has no axis '" + axis + "'; its axes are: " + join_names(names_));
  }
  return static_cast<int>(it - names_.begin());
}

int64_t DeviceMesh::size(const std::string& axis) const { return shape_[axis_index(axis)]; }

int64_t DeviceMesh::local_rank(const std::string& axis) const {
  return coords_of(my_index_, shape_)[axis_index(axis)];
}

int64_t DeviceMesh::rank() const { return my_index_; }

std::vector<int64_t> DeviceMesh::coordinates() const { return coords_of(my_index_, shape_); }

DeviceMesh DeviceMesh::operator[](const std::string& axis) const {
  return (*this)[std::vector<std::string>{axis}];
}

DeviceMesh DeviceMesh::operator[](const std::vector<std::string>& axes) const {
  if (axes.empty()) throw UserError("a sub-mesh needs at least one axis name");
  std::vector<int> dims;
  std::vector<int64_t> sub_shape;
  for (const auto& a : axes) {
    dims.push_back(axis_index(a));
    sub_shape.push_back(shape_[dims.back()]);
  }
  if (axes.size() == 1 && shape_.size() == 1 && !axis_comms_.empty()) return *this;
  // Walk the sub-mesh row-major; the other coordinates stay at this process's.
  const std::vector<int64_t> mine = coords_of(my_index_, shape_);
  std::vector<int> sub_ranks;
  for (int64_t i = 0; i < product(sub_shape); ++i) {
    std::vector<int64_t> c = mine;
    const std::vector<int64_t> sub = coords_of(i, sub_shape);
    for (size_t k = 0; k < dims.size(); ++k) c[dims[k]] = sub[k];
    sub_ranks.push_back(ranks_[index_of(c, shape_)]);
  }
  if (axes.size() == 1) {
    // A 1-D mesh: build it without recursing into the constructor's own axis lookup.
    DeviceMesh sub = *this;
    sub.shape_ = sub_shape;
    sub.names_ = axes;
    sub.ranks_ = sub_ranks;
    sub.my_index_ = std::find(sub_ranks.begin(), sub_ranks.end(), world_->global_rank()) - sub_ranks.begin();
    sub.axis_comms_ = {world_->group(sub_ranks, axes[0])};
    sub.mesh_comm_ = sub.axis_comms_[0];
    return sub;
  }
  return DeviceMesh(world_, device_type_, sub_shape, axes, sub_ranks);
}

DeviceMesh DeviceMesh::flatten(const std::string& new_name) const {
  if (new_name.empty()) throw UserError("flatten needs a non-empty axis name");
  DeviceMesh flat = *this;
  flat.shape_ = {size()};
  flat.names_ = {new_name};
  flat.axis_comms_ = {world_->group(ranks_, new_name)};
  flat.mesh_comm_ = flat.axis_comms_[0];
  return flat;
}

std::shared_ptr<comm::Communicator> DeviceMesh::comm(const std::string& axis) const {
  return axis_comms_[axis_index(axis)];
}

std::shared_ptr<comm::Communicator> DeviceMesh::comm() const {
  if (!mesh_comm_) {
    std::string name;
    for (const auto& n : names_) name += (name.empty() ? "" : "_") + n;
    mesh_comm_ = world_->group(ranks_, name);
  }
  return mesh_comm_;
}

std::string DeviceMesh::to_string() const { return "DeviceMesh(" + device_type_ + ", " + shape_string(shape_, names_) + ")"; }

DeviceMesh init_device_mesh(std::shared_ptr<comm::Communicator> world, const std::string& device_type,
                            const std::vector<int64_t>& shape, const std::vector<std::string>& names) {
  if (!world) throw UserError("init_device_mesh needs the world communicator (see init_process_group)");
  if (device_type != "cpu") {
    throw UserError("device_type '" + device_type + "' is not available: this build runs on 'cpu' (c10d Gloo)");
  }
  validate_layout(shape, names);
  if (product(shape) != world->size()) {
    std::ostringstream factors;
    for (size_t i = 0; i < shape.size(); ++i) factors << (i ? " x " : "") << names[i] << "(" << shape[i] << ")";
    throw UserError("mesh " + factors.str() + " = " + std::to_string(product(shape)) + " != world size " +
                    std::to_string(world->size()));
  }
  std::vector<int> ranks(world->global_ranks());
  return DeviceMesh(std::move(world), device_type, shape, names, ranks);
}

}  // namespace hyperparallel::mesh
