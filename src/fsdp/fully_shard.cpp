// fully_shard: choose a unit's parameters, build the unit, attach it to the module.
#include "hyperparallel/fsdp/fully_shard.h"

#include <torch/nn/module.h>

#include <set>

#include "fsdp_unit.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::fsdp {
namespace {

bool under(const std::string& name, const std::string& prefix) {
  return prefix.empty() || name.rfind(prefix + ".", 0) == 0;
}

std::string join(const std::string& prefix, const std::string& name) { return prefix.empty() ? name : prefix + "." + name; }

}  // namespace

FSDPModule fully_shard(torch::nn::Module& module, const FullyShardOptions& options) {
  if (!options.mesh) {
    throw UserError("fully_shard: FullyShardOptions::mesh is empty; pass a 1-D mesh, e.g. "
                    "init_device_mesh(world, \"cpu\", {world->size()}, {\"dp_shard\"})");
  }
  if (options.mesh->ndim() != 1) {
    throw UserError("fully_shard: mesh " + options.mesh->to_string() +
                    " has more than one axis; HSDP (2-D meshes) is not supported yet");
  }
  if (find_hooks(module)) throw UserError("fully_shard: module " + module.name() + " is already sharded");

  // Parameters owned by units below this module, and where those units sit.
  std::set<const c10::TensorImpl*> owned_below;
  std::vector<std::string> unit_prefixes;
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    auto* unit = dynamic_cast<FSDPUnit*>(find_hooks(*item.value()));
    if (!unit) continue;
    unit_prefixes.push_back(item.key());
    for (const auto& sp : unit->params()) owned_below.insert(sp.param.unsafeGetTensorImpl());
  }

  std::vector<std::pair<std::string, at::Tensor>> params;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const c10::TensorImpl* impl = item.value().unsafeGetTensorImpl();
    bool in_unit_subtree = false;
    for (const auto& prefix : unit_prefixes) in_unit_subtree |= under(item.key(), prefix);
    if (owned_below.count(impl)) {
      if (!in_unit_subtree) {
        throw UserError("fully_shard: parameter " + item.key() +
                        " is tied to a parameter of a unit below this module; tied parameters must be in one "
                        "unit: apply fully_shard to a module that contains every use (e.g. the root) instead");
      }
      continue;
    }
    if (in_unit_subtree || !seen.insert(impl).second) continue;
    params.emplace_back(item.key(), item.value());
  }
  auto unit = std::make_shared<FSDPUnit>(module, std::move(params), options.mesh->comm(), options);
  attach_hooks(module, unit);
  return FSDPModule(unit);
}

std::map<std::string, at::Tensor> full_parameters(torch::nn::Module& root) {
  std::map<std::string, at::Tensor> out;
  std::set<const c10::TensorImpl*> done;
  for (const auto& item : root.named_modules()) {
    auto* unit = dynamic_cast<FSDPUnit*>(find_hooks(*item.value()));
    if (!unit) continue;
    const bool was_sharded = unit->state() == UnitState::kSharded;
    unit->unshard();
    for (const auto& sp : unit->params()) {
      out[join(item.key(), sp.name)] = sp.param.detach().clone();
      done.insert(sp.param.unsafeGetTensorImpl());
    }
    if (was_sharded) unit->reshard();
  }
  for (const auto& item : root.named_parameters()) {
    if (!done.count(item.value().unsafeGetTensorImpl())) out[item.key()] = item.value().detach().clone();
  }
  return out;
}

}  // namespace hyperparallel::fsdp
