#include "hyperparallel/mesh/parallel_dims.h"

#include <sstream>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::mesh {
namespace {

void check_positive(const char* name, int64_t value, bool may_infer) {
  if (value >= 1 || (may_infer && value == -1)) return;
  throw UserError(std::string(name) + " = " + std::to_string(value) + " is not allowed; use an integer >= 1" +
                  (may_infer ? " or -1 to infer it" : ""));
}

}  // namespace

std::string ParallelDims::to_string() const {
  std::ostringstream out;
  out << "dp_replicate(" << dp_replicate << ") x dp_shard(" << dp_shard << ") x cp(" << cp << ") x tp(" << tp
      << ") x pp(" << pp << ")";
  return out.str();
}

ParallelDims ParallelDims::resolved(int64_t world_size) const {
  check_positive("dp_replicate", dp_replicate, false);
  check_positive("dp_shard", dp_shard, true);
  check_positive("cp", cp, false);
  check_positive("tp", tp, false);
  check_positive("pp", pp, false);
  check_positive("ep", ep, false);
  check_positive("edp_shard", edp_shard, true);
  ParallelDims d = *this;
  if (d.dp_shard == -1) {
    const int64_t others = d.dp_replicate * d.cp * d.tp * d.pp;
    if (world_size % others != 0) {
      throw UserError("cannot infer dp_shard: world size " + std::to_string(world_size) +
                      " is not divisible by dp_replicate(" + std::to_string(dp_replicate) + ") x cp(" +
                      std::to_string(cp) + ") x tp(" + std::to_string(tp) + ") x pp(" + std::to_string(pp) +
                      ") = " + std::to_string(others));
    }
    d.dp_shard = world_size / others;
  }
  const int64_t total = d.dp_replicate * d.dp_shard * d.cp * d.tp * d.pp;
  if (total != world_size) {
    throw UserError(d.to_string() + " = " + std::to_string(total) + " != world size " + std::to_string(world_size) +
                    "; set dp_shard_size: -1 to infer it");
  }
  const int64_t dense_block = d.dp_shard * d.cp * d.tp;
  if (dense_block % d.ep != 0) {
    throw UserError("ep(" + std::to_string(d.ep) + ") does not divide dp_shard(" + std::to_string(d.dp_shard) +
                    ") x cp(" + std::to_string(d.cp) + ") x tp(" + std::to_string(d.tp) + ") = " +
                    std::to_string(dense_block) + "; experts reuse those ranks as edp x ep");
  }
  if (d.edp_shard == -1) d.edp_shard = dense_block / d.ep;
  if (d.edp_shard * d.ep != dense_block) {
    throw UserError("edp_shard(" + std::to_string(d.edp_shard) + ") x ep(" + std::to_string(d.ep) + ") = " +
                    std::to_string(d.edp_shard * d.ep) + " != dp_shard(" + std::to_string(d.dp_shard) + ") x cp(" +
                    std::to_string(d.cp) + ") x tp(" + std::to_string(d.tp) + ") = " + std::to_string(dense_block) +
                    "; set edp_shard_size: -1 to infer it");
  }
  return d;
}

DeviceMesh ParallelDims::build_mesh(std::shared_ptr<comm::Communicator> world) const {
  const ParallelDims d = resolved(world->size());
  return init_device_mesh(std::move(world), "cpu", {d.pp, d.dp_replicate, d.dp_shard, d.cp, d.tp},
                          {"pp", "dp_replicate", "dp_shard", "cp", "tp"});
}

DeviceMesh ParallelDims::build_expert_mesh(std::shared_ptr<comm::Communicator> world) const {
  const ParallelDims d = resolved(world->size());
  return init_device_mesh(std::move(world), "cpu", {d.pp, d.dp_replicate, d.edp_shard, d.ep},
                          {"pp", "dp_replicate", "edp", "ep"});
}

}  // namespace hyperparallel::mesh
