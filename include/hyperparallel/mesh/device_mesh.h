// DeviceMesh: the world's ranks laid out as an n-D array with named axes, and the
// communicator of each axis.
//
// A mesh of shape (2, 2) named ("dp_replicate", "dp_shard") over ranks 0..3 puts rank r at
// coordinates (r / 2, r % 2). The communicator of axis "dp_shard" for rank 1 is the group of
// ranks that share rank 1's other coordinates: {0, 1}. Like PyTorch's DeviceMesh, each
// process holds the whole layout, and sub-meshes (mesh["tp"], mesh[{"dp_shard", "cp"}]) are
// the slice that contains this process.
// Groups: every axis group of this process is created when the mesh is built (collective:
// every rank builds the same meshes in the same order); the group of a multi-axis
// sub-mesh or of flatten() is created on first use and cached in the world's registry,
// so the same set of ranks always maps to the same Communicator. No global default mesh.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "hyperparallel/comm/communicator.h"

namespace hyperparallel::mesh {

class DeviceMesh {
 public:
  // `ranks` are world ranks in row-major order over `shape`; this process must be in them.
  DeviceMesh(std::shared_ptr<comm::Communicator> world, std::string device_type, std::vector<int64_t> shape,
             std::vector<std::string> names, std::vector<int> ranks);

  const std::string& device_type() const { return device_type_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<std::string>& axis_names() const { return names_; }
  const std::vector<int>& ranks() const { return ranks_; }  // world ranks, row-major
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size() const;                            // number of ranks in the mesh
  int64_t size(const std::string& axis) const;
  int64_t local_rank(const std::string& axis) const;  // this process's coordinate on the axis
  int64_t rank() const;                            // this process's index in ranks()
  std::vector<int64_t> coordinates() const;        // this process's coordinates

  // The sub-mesh over the named axes (in the order given) that contains this process.
  DeviceMesh operator[](const std::string& axis) const;
  DeviceMesh operator[](const std::vector<std::string>& axes) const;
  // Makes mesh[{"dp_shard", "cp"}] unambiguous (std::string has an iterator-pair constructor).
  DeviceMesh operator[](std::initializer_list<std::string> axes) const {
    return (*this)[std::vector<std::string>(axes)];
  }
  // A 1-D mesh over the same ranks, with the axes merged into `new_name`.
  DeviceMesh flatten(const std::string& new_name) const;

  // The communicator of one axis (the ranks that differ from this process only there).
  std::shared_ptr<comm::Communicator> comm(const std::string& axis) const;
  // The communicator over the whole mesh (created on first use for multi-axis meshes).
  std::shared_ptr<comm::Communicator> comm() const;

  std::string to_string() const;  // "DeviceMesh(cpu, (dp_replicate=2, dp_shard=2))"

 private:
  int axis_index(const std::string& axis) const;

  std::shared_ptr<comm::Communicator> world_;
  std::string device_type_;
  std::vector<int64_t> shape_;
  std::vector<std::string> names_;
  std::vector<int> ranks_;
  int64_t my_index_ = 0;
  std::vector<std::shared_ptr<comm::Communicator>> axis_comms_;
  mutable std::shared_ptr<comm::Communicator> mesh_comm_;
};

// A mesh over every rank of `world` (product of shape == world size). device_type: "cpu".
// Throws UserError naming the shape and the world size when they do not match.
DeviceMesh init_device_mesh(std::shared_ptr<comm::Communicator> world, const std::string& device_type,
                            const std::vector<int64_t>& shape, const std::vector<std::string>& names);

}  // namespace hyperparallel::mesh
