// ParallelDims: the degrees of every kind of parallelism of one job, validated against
// the world size, and the meshes they imply.
//
// Dense layout (row-major, outermost first): pp x dp_replicate x dp_shard x cp x tp.
// Experts reuse the same ranks: the dp_shard x cp x tp block is read again as edp x ep
// (dp_shard·cp·tp = edp·ep), so an MoE layer shards experts over "ep" and its expert
// weights over "edp" while dense layers use the dense axes. dp_shard = -1 (and edp = -1)
// are inferred. Errors name every factor: "dp_replicate(2) x dp_shard(3) x cp(1) x tp(1)
// x pp(1) = 6 != world size 4".
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/mesh/device_mesh.h"

namespace hyperparallel::mesh {

struct ParallelDims {
  int64_t dp_replicate = 1;
  int64_t dp_shard = -1;  // -1: whatever the world size leaves
  int64_t cp = 1;
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t ep = 1;
  int64_t edp_shard = -1;  // -1: dp_shard·cp·tp / ep

  // A copy with the inferred degrees filled in; throws UserError when the degrees do not
  // multiply to `world_size` or EP does not fit.
  ParallelDims resolved(int64_t world_size) const;

  int64_t dp() const { return dp_replicate * dp_shard; }  // data-parallel degree (resolved)
  std::string to_string() const;

  // (pp, dp_replicate, dp_shard, cp, tp) over every rank of `world`.
  DeviceMesh build_mesh(std::shared_ptr<comm::Communicator> world) const;
  // (pp, dp_replicate, edp, ep) over the same ranks.
  DeviceMesh build_expert_mesh(std::shared_ptr<comm::Communicator> world) const;
};

}  // namespace hyperparallel::mesh
