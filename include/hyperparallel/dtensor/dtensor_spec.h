// DTensorSpec: the layout of one distributed tensor — a mesh, one placement per mesh axis,
// and the global shape — from which every rank's piece follows (placement.h, local_box).
//
// A spec is a value: it holds the mesh (communicators by shared pointer) and never the data.
// Nothing downstream needs to know which parallelism produced it: TP makes a weight
// [Shard(0)] on the tp axis, FSDP then shards that local tensor on the dp axes, and a
// checkpoint writes each rank's box with its N-D offsets. See docs/dtensor.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hyperparallel/dtensor/placement.h"
#include "hyperparallel/mesh/device_mesh.h"

namespace hyperparallel::dtensor {

class DTensorSpec {
 public:
  // Throws UserError when the placements do not fit the mesh or the shape.
  DTensorSpec(mesh::DeviceMesh mesh, Placements placements, std::vector<int64_t> global_shape);

  const mesh::DeviceMesh& mesh() const { return mesh_; }
  const Placements& placements() const { return placements_; }
  const std::vector<int64_t>& global_shape() const { return global_shape_; }

  Box local_box() const;                                       // this rank's piece
  Box box_of(const std::vector<int64_t>& mesh_coords) const;   // any rank's piece
  std::vector<int64_t> local_shape() const { return local_box().lengths; }
  // The same mesh and shape under other placements.
  DTensorSpec with_placements(Placements placements) const;

  // "DTensorSpec((tp=2), [Shard(0)], global [8, 4])"
  std::string to_string() const;

 private:
  mesh::DeviceMesh mesh_;
  Placements placements_;
  std::vector<int64_t> global_shape_;
};

}  // namespace hyperparallel::dtensor
