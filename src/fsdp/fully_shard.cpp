// fully_shard: choose a unit's parameters, build the unit, attach it to the module.
#include "hyperparallel/fsdp/fully_shard.h"

#include <torch/nn/module.h>

#include <set>

#include "fsdp_root.h"
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
  if (options.mesh->ndim() > 2) {
    throw UserError("fully_shard: mesh " + options.mesh->to_string() +
                    " has more than two axes; use a 1-D mesh (FSDP) or a 2-D (replicate, shard) mesh (HSDP)");
  }
  if (options.forward_prefetch_depth < 0 || options.backward_prefetch_depth < 0) {
    throw UserError("fully_shard: prefetch depths must be >= 0 (0 turns prefetching off)");
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
  const auto& names = options.mesh->axis_names();
  auto shard_comm = options.mesh->comm(names.back());
  auto replicate_comm = names.size() == 2 ? options.mesh->comm(names.front()) : nullptr;
  auto unit = std::make_shared<FSDPUnit>(module, std::move(params), shard_comm, replicate_comm, options);
  attach_hooks(module, unit);
  return FSDPModule(unit);
}

UnitState FSDPModule::state() const { return unit_->state(); }
void FSDPModule::unshard() { unit_->unshard(); }
void FSDPModule::reshard() { unit_->reshard(); }
int64_t FSDPModule::sharded_numel() const { return unit_->sharded_numel(); }
int64_t FSDPModule::unsharded_numel() const { return unit_->unsharded_numel(); }
size_t FSDPModule::unit_param_count() const { return unit_->params().size(); }

void FSDPModule::set_requires_gradient_sync(bool sync) {
  for (FSDPUnit* u : unit_->units_below()) u->settings().requires_gradient_sync = sync;
}

void FSDPModule::set_gradient_scaling_factor(std::optional<double> factor) {
  for (FSDPUnit* u : unit_->units_below()) u->settings().gradient_scaling_factor = factor;
}

void FSDPModule::set_reduce_op_type(const std::string& op) {
  if (op != "avg" && op != "sum") throw UserError("reduce op type '" + op + "' is not one of: avg, sum");
  for (FSDPUnit* u : unit_->units_below()) u->settings().reduce_op = op == "avg" ? comm::ReduceOp::kAvg : comm::ReduceOp::kSum;
}

void FSDPModule::set_reshard_after_forward(bool reshard) {
  for (FSDPUnit* u : unit_->units_below()) u->settings().reshard_after_forward = reshard;
}

void FSDPModule::set_reshard_after_backward(bool reshard) {
  for (FSDPUnit* u : unit_->units_below()) u->settings().reshard_after_backward = reshard;
}

namespace {
std::vector<FSDPUnit*> units_of(const std::vector<FSDPModule>& modules) {
  std::vector<FSDPUnit*> units;
  for (const auto& m : modules) units.push_back(m.unit().get());
  return units;
}
}  // namespace

void FSDPModule::set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules) {
  unit_->settings().forward_prefetch = units_of(modules);
}

void FSDPModule::set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules) {
  unit_->settings().backward_prefetch = units_of(modules);
}

int FSDPModule::max_live_unsharded_units() const { return unit_->root() ? unit_->root()->max_live_unsharded() : 0; }

void FSDPModule::reset_max_live_unsharded_units() {
  if (unit_->root()) unit_->root()->reset_max_live();
}

std::map<std::string, at::Tensor> full_parameters(torch::nn::Module& root) {
  std::map<std::string, at::Tensor> out;
  std::set<const c10::TensorImpl*> done;
  for (const auto& item : root.named_modules()) {
    auto* unit = dynamic_cast<FSDPUnit*>(find_hooks(*item.value()));
    if (!unit) continue;
    const std::vector<at::Tensor> full = unit->gather_full_masters();
    for (size_t i = 0; i < full.size(); ++i) {
      out[join(item.key(), unit->params()[i].name)] = full[i];
      done.insert(unit->params()[i].param.unsafeGetTensorImpl());
    }
  }
  for (const auto& item : root.named_parameters()) {
    if (!done.count(item.value().unsafeGetTensorImpl())) out[item.key()] = item.value().detach().clone();
  }
  return out;
}

}  // namespace hyperparallel::fsdp
