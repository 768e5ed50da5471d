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
// Each unit is a state machine (docs/fsdp.md "States"): SHARDED -> UNSHARDED -> SHARDED.
// A module takes part through hyperparallel::fsdp::hooked_forward (module_hooks.h).
// Not yet: HSDP (2-D meshes), mixed precision, offload, prefetch, reshard to a smaller group.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "hyperparallel/comm/comm_counters.h"
#include "hyperparallel/mesh/device_mesh.h"

namespace torch::nn {
class Module;
}

namespace hyperparallel::fsdp {

struct FullyShardOptions {
  // The ranks to shard over: a 1-D mesh. Required (there is no global default group).
  std::optional<mesh::DeviceMesh> mesh;
  // Free the full parameters after forward (all-gather again in backward) or keep them.
  bool reshard_after_forward = true;
};

enum class UnitState { kSharded, kUnsharded };
const char* to_string(UnitState state);

class FSDPUnit;  // src/fsdp/fsdp_unit.h

// The handle fully_shard returns; the unit itself lives on the module (module_hooks.h).
class FSDPModule {
 public:
  explicit FSDPModule(std::shared_ptr<FSDPUnit> unit) : unit_(std::move(unit)) {}
  UnitState state() const;
  void unshard();  // all-gather now (blocking)
  void reshard();  // free the full parameters
  int64_t sharded_numel() const;    // elements of the local flat shard (with padding)
  int64_t unsharded_numel() const;  // elements of the all-gather buffer (with padding)
  const std::shared_ptr<FSDPUnit>& unit() const { return unit_; }

 private:
  std::shared_ptr<FSDPUnit> unit_;
};

FSDPModule fully_shard(torch::nn::Module& module, const FullyShardOptions& options);

// Every parameter of `root` by its full name, unsharded (padding removed), on every rank.
// Collective over each unit's ranks.
std::map<std::string, at::Tensor> full_parameters(torch::nn::Module& root);

}  // namespace hyperparallel::fsdp
