// fully_shard: choose a unit's parameters, build the unit, attach it to the module.
#include "hyperparallel/fsdp/fully_shard.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <set>

#include "fsdp_root.h"
#include "fsdp_unit.h"
#include "hyperparallel/dtensor/dtensor.h"
#include "hyperparallel/dtensor/parameter_specs.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::fsdp {
namespace {

bool under(const std::string& name, const std::string& prefix) {
  return prefix.empty() || name.rfind(prefix + ".", 0) == 0;
}


}  // namespace

FSDPModule fully_shard(torch::nn::Module& module, const FullyShardOptions& options) {
  return fully_shard(std::vector<torch::nn::Module*>{&module}, options);
}

namespace {

// No mesh given: the one every unit already sharded below `modules` uses. There is no global
// default process group to fall back on, so the first fully_shard call (bottom-up: a decoder
// layer) names the mesh and the calls above it (the root) may leave it out.
mesh::DeviceMesh inherited_mesh(const std::vector<torch::nn::Module*>& modules) {
  std::optional<mesh::DeviceMesh> found;
  for (torch::nn::Module* module : modules) {
    for (const auto& item : module->named_modules("", /*include_self=*/false)) {
      auto* unit = dynamic_cast<FSDPUnit*>(find_hooks(*item.value()));
      if (!unit) continue;
      if (found && (found->comm() != unit->mesh().comm() || found->shape() != unit->mesh().shape())) {
        throw UserError("fully_shard: FullyShardOptions::mesh is empty and the units below use different meshes (" +
                        found->to_string() + ", " + unit->mesh().to_string() + "); pass the mesh explicitly");
      }
      found = unit->mesh();
    }
  }
  if (!found) {
    throw UserError("fully_shard: FullyShardOptions::mesh is empty and no module below is sharded yet; pass a mesh, e.g. "
                    "init_device_mesh(world, \"cpu\", {world->size()}, {\"dp_shard\"}), to the first call (later "
                    "calls on modules above it inherit it; there is no global default group)");
  }
  return *found;
}

}  // namespace

FSDPModule fully_shard(const std::vector<torch::nn::Module*>& modules, const FullyShardOptions& given) {
  FullyShardOptions options = given;
  if (!options.mesh) options.mesh = inherited_mesh(modules);
  // A mesh with a model-parallel axis would silently shard (or average) over it.
  for (const auto& axis : options.mesh->axis_names()) {
    if (axis == "tp" || axis == "ep" || axis == "pp" || axis == "cp") {
      throw UserError("fully_shard: mesh " + options.mesh->to_string() + " has the model-parallel axis '" + axis +
                      "'; pass the data-parallel sub-mesh, e.g. mesh[\"dp_shard\"] (FSDP) or mesh[{\"dp_replicate\", "
                      "\"dp_shard\"}] (HSDP)");
    }
  }
  if (options.mesh->ndim() > 2) {
    throw UserError("fully_shard: mesh " + options.mesh->to_string() +
                    " has more than two axes; use a 1-D mesh (FSDP) or a 2-D (replicate, shard) mesh (HSDP)");
  }
  if (options.forward_prefetch_depth < 0 || options.backward_prefetch_depth < 0) {
    throw UserError("fully_shard: prefetch depths must be >= 0 (0 turns prefetching off)");
  }
  if (modules.empty()) throw UserError("fully_shard: the list of modules is empty");
  for (torch::nn::Module* module : modules) {
    if (find_hooks(*module)) throw UserError("fully_shard: module " + module->name() + " is already sharded");
  }

  std::set<const c10::TensorImpl*> ignored, replicate;
  for (const auto& t : options.ignored_params) ignored.insert(t.unsafeGetTensorImpl());
  for (const auto& t : options.replicate_params) replicate.insert(t.unsafeGetTensorImpl());
  std::vector<FSDPUnit::Param> params;
  FSDPUnit::NamedTensors replicated;
  std::set<const c10::TensorImpl*> seen;
  for (size_t m = 0; m < modules.size(); ++m) {
    // Parameters owned by units below this module, and where those units sit.
    std::set<const c10::TensorImpl*> owned_below;
    std::vector<std::string> unit_prefixes;
    for (const auto& item : modules[m]->named_modules("", /*include_self=*/false)) {
      auto* unit = dynamic_cast<FSDPUnit*>(find_hooks(*item.value()));
      if (!unit) continue;
      unit_prefixes.push_back(item.key());
      for (const auto& sp : unit->params()) owned_below.insert(sp.param.unsafeGetTensorImpl());
    }
    for (const auto& item : modules[m]->named_parameters(/*recurse=*/true)) {
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
      if (in_unit_subtree || !seen.insert(impl).second || ignored.count(impl)) continue;
      if (replicate.count(impl)) {
        replicated.emplace_back(item.key(), item.value());
      } else {
        params.push_back({item.key(), item.value(), m});
      }
    }
  }
  const auto& names = options.mesh->axis_names();
  auto shard_comm = options.mesh->comm(names.back());
  auto replicate_comm = names.size() == 2 ? options.mesh->comm(names.front()) : nullptr;
  auto unit = std::make_shared<FSDPUnit>(modules, std::move(params), std::move(replicated), shard_comm, replicate_comm,
                                         options.mesh->comm(), options);
  for (torch::nn::Module* module : modules) attach_hooks(*module, unit);
  return FSDPModule(unit);
}

TrainingState FSDPModule::training_state() const { return unit_->training_state(); }
UnitState FSDPModule::state() const { return unit_->state(); }
UnshardHandle FSDPModule::unshard() {
  unit_->unshard_async();
  return UnshardHandle(unit_);
}

void UnshardHandle::wait() {
  if (unit_) unit_->unshard();
  unit_.reset();
}
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

void FSDPModule::set_trace(std::shared_ptr<platform::TraceRecorder> trace) {
  for (FSDPUnit* u : unit_->units_below()) u->set_trace(trace);
}

int FSDPModule::max_live_unsharded_units() const { return unit_->root() ? unit_->root()->max_live_unsharded() : 0; }

void FSDPModule::reset_max_live_unsharded_units() {
  if (unit_->root()) unit_->root()->reset_max_live();
}

namespace {

}  // namespace

UnitsAndPaths units_under(torch::nn::Module& root) {
  UnitsAndPaths out;
  for (const auto& item : root.named_modules()) {
    out.paths[item.value().get()] = item.key();
    auto* unit = dynamic_cast<FSDPUnit*>(find_hooks(*item.value()));
    if (unit && std::find(out.units.begin(), out.units.end(), unit) == out.units.end()) out.units.push_back(unit);
  }
  return out;
}

namespace {

std::string shape_text(at::IntArrayRef shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Names the keys a state dict lacks and the ones it has too many of.
template <typename Map>
void check_keys(const std::set<std::string>& expected, const Map& state) {
  std::string missing, unexpected;
  for (const auto& name : expected) {
    if (!state.count(name)) missing += (missing.empty() ? "" : ", ") + name;
  }
  for (const auto& item : state) {
    if (!expected.count(item.first)) unexpected += (unexpected.empty() ? "" : ", ") + item.first;
  }
  if (!missing.empty() || !unexpected.empty()) {
    throw UserError("state dict does not match the model: missing keys [" + missing + "], unexpected keys [" +
                    unexpected + "]");
  }
}

}  // namespace

std::map<std::string, at::Tensor> full_parameters(torch::nn::Module& root) {
  std::map<std::string, at::Tensor> out;
  std::set<const c10::TensorImpl*> done;
  const UnitsAndPaths found = units_under(root);
  for (FSDPUnit* unit : found.units) {
    const std::vector<at::Tensor> full = unit->gather_full_masters();
    for (size_t i = 0; i < full.size(); ++i) {
      out[found.key(*unit, unit->params()[i])] = full[i];
      done.insert(unit->params()[i].param.unsafeGetTensorImpl());
    }
  }
  for (const auto& item : root.named_parameters()) {
    if (!done.count(item.value().unsafeGetTensorImpl())) out[item.key()] = item.value().detach().clone();
  }
  for (const auto& [name, spec] : dtensor::parameter_specs(root)) {  // name order: the same on every rank
    out[name] = dtensor::DTensor(out.at(name), spec).full_tensor();
  }
  for (const auto& [name, owner] : dtensor::parameter_owners(root)) {  // from the rank that holds it
    // fp32 on the wire whatever the holder has (FSDP's masters are fp32, an unsharded model's
    // parameters its own dtype), so every rank's buffer has the same size.
    // A rank without it returns what the holder had: FSDP's fp32 master, or an unsharded
    // model's parameter in its own dtype.
    const at::ScalarType dtype = owner.held_here() ? out.at(name).scalar_type() : found.units.empty() ? owner.dtype : at::kFloat;
    at::Tensor t = owner.held_here() ? out.at(name).to(at::kFloat).contiguous() : at::empty(owner.shape, at::kFloat);
    owner.group->broadcast(t, owner.owner).wait();
    out[name] = t.to(dtype);
  }
  return out;
}

namespace {

// FSDP's rows [first, first + rows) of dim `dim` of a tensor-parallel piece of shape
// `piece_shape`, as a box of the global tensor.
dtensor::Box global_box(torch::nn::Module& root, const std::string& name, const std::vector<int64_t>& piece_shape,
                        int64_t dim, int64_t first, int64_t rows) {
  dtensor::Box box = dtensor::parameter_box(root, name, piece_shape);
  if (!piece_shape.empty()) {
    box.offsets[dim] += first;
    box.lengths[dim] = rows;
  }
  return box;
}

std::vector<int64_t> global_shape_of(torch::nn::Module& root, const std::string& name, const std::vector<int64_t>& piece_shape) {
  const dtensor::DTensorSpec* spec = dtensor::find_parameter_spec(root, name);
  return spec ? spec->global_shape() : piece_shape;
}

}  // namespace

std::map<std::string, ShardedTensor> sharded_state_dict(torch::nn::Module& root) {
  std::map<std::string, ShardedTensor> out;
  std::set<const c10::TensorImpl*> done;
  const UnitsAndPaths found = units_under(root);
  for (FSDPUnit* unit : found.units) {
    for (size_t i = 0; i < unit->params().size(); ++i) {
      const std::string name = found.key(*unit, unit->params()[i]);
      ShardedTensor t = unit->local_shard(i);
      const std::vector<int64_t> piece = t.global_shape;
      const int64_t rows = t.local.dim() == 0 ? 1 : t.local.size(t.shard_dim);
      const dtensor::Box box = global_box(root, name, piece, t.shard_dim, t.row_offset, rows);
      t.offsets = box.offsets;
      t.lengths = box.lengths;
      t.global_shape = global_shape_of(root, name, piece);
      out[name] = std::move(t);
      done.insert(unit->params()[i].param.unsafeGetTensorImpl());
    }
  }
  for (const auto& item : root.named_parameters()) {
    if (done.insert(item.value().unsafeGetTensorImpl()).second) {
      const std::vector<int64_t> piece = item.value().sizes().vec();
      const dtensor::Box box = dtensor::parameter_box(root, item.key(), piece);
      out[item.key()] = ShardedTensor{item.value().detach().clone(), global_shape_of(root, item.key(), piece), 0, 0,
                                      box.offsets, box.lengths};
    }
  }
  return out;
}

std::map<std::string, at::Tensor> full_state_dict(torch::nn::Module& root, bool rank0_only) {
  auto full = full_parameters(root);
  if (!rank0_only) return full;
  const auto units = units_under(root).units;
  const bool rank0 = units.empty() || units.front()->global_rank() == 0;
  if (!rank0) full.clear();
  return full;
}

void load_sharded_state_dict(torch::nn::Module& root, const std::map<std::string, ShardedTensor>& state) {
  const auto expected = sharded_state_dict(root);
  std::set<std::string> names;
  for (const auto& item : expected) names.insert(item.first);
  check_keys(names, state);
  for (const auto& [name, want] : expected) {
    const ShardedTensor& got = state.at(name);
    if (got.local.sizes() != want.local.sizes() || got.global_shape != want.global_shape || got.row_offset != want.row_offset) {
      throw UserError("state dict entry " + name + ": shard " + shape_text(got.local.sizes()) + " at row " +
                      std::to_string(got.row_offset) + " of " + shape_text(got.global_shape) + ", but this rank holds " +
                      shape_text(want.local.sizes()) + " at row " + std::to_string(want.row_offset) + " of " +
                      shape_text(want.global_shape) + "; load a full state dict to change layouts");
    }
  }
  at::NoGradGuard no_grad;
  std::set<const c10::TensorImpl*> done;
  const UnitsAndPaths found = units_under(root);
  for (FSDPUnit* unit : found.units) {
    unit->reshard();
    for (size_t i = 0; i < unit->params().size(); ++i) {
      unit->load_local_rows(i, state.at(found.key(*unit, unit->params()[i])).local);
      done.insert(unit->params()[i].param.unsafeGetTensorImpl());
    }
  }
  for (const auto& item : root.named_parameters()) {
    if (done.insert(item.value().unsafeGetTensorImpl()).second) item.value().copy_(state.at(item.key()).local);
  }
}

std::vector<int64_t> separate_master_numels(torch::nn::Module& root) {
  std::vector<int64_t> numels;
  for (FSDPUnit* unit : units_under(root).units) {
    if (unit->has_separate_masters()) numels.push_back(unit->sharded_numel());
  }
  return numels;
}

void place_master_shards(torch::nn::Module& root, const MasterShardPlacement& placement) {
  size_t k = 0;
  for (FSDPUnit* unit : units_under(root).units) {
    if (!unit->has_separate_masters()) continue;
    at::Tensor storage = placement.allocate(k++, unit->sharded_numel());
    if (storage.numel() != unit->sharded_numel() || storage.scalar_type() != at::kFloat || !storage.is_contiguous()) {
      throw std::logic_error("place_master_shards: the buffer for unit " + std::to_string(k - 1) + " is not " +
                             std::to_string(unit->sharded_numel()) + " contiguous fp32 elements");
    }
    unit->place_masters(std::move(storage), placement.release);
  }
}

std::map<std::string, std::vector<int64_t>> full_parameter_shapes(torch::nn::Module& root) {
  const UnitsAndPaths found = units_under(root);
  std::map<std::string, std::vector<int64_t>> shapes;
  std::set<const c10::TensorImpl*> managed;
  for (FSDPUnit* unit : found.units) {
    for (const auto& sp : unit->params()) {
      shapes[found.key(*unit, sp)] = sp.shape;
      managed.insert(sp.param.unsafeGetTensorImpl());
    }
  }
  for (const auto& item : root.named_parameters()) {
    if (!managed.count(item.value().unsafeGetTensorImpl()) && !shapes.count(item.key())) shapes[item.key()] = item.value().sizes().vec();
  }
  for (auto& [name, shape] : shapes) shape = global_shape_of(root, name, shape);
  for (const auto& [name, owner] : dtensor::parameter_owners(root)) shapes.emplace(name, owner.shape);
  return shapes;
}

void load_full_state_dict(torch::nn::Module& root, const std::map<std::string, at::Tensor>& state) {
  const UnitsAndPaths found = units_under(root);
  const auto shapes = full_parameter_shapes(root);
  std::set<std::string> names;
  for (const auto& item : shapes) names.insert(item.first);
  check_keys(names, state);
  for (const auto& [name, shape] : shapes) {
    if (state.at(name).sizes().vec() != shape) {
      throw UserError("state dict entry " + name + " has shape " + shape_text(state.at(name).sizes()) +
                      ", the model's parameter has " + shape_text(shape));
    }
  }
  // This rank's tensor-parallel piece of a full tensor (the tensor itself without TP).
  const auto piece_of = [&](const std::string& name) {
    const at::Tensor& full = state.at(name);
    const dtensor::DTensorSpec* spec = dtensor::find_parameter_spec(root, name);
    if (!spec) return full;
    at::Tensor t = full;
    const dtensor::Box box = spec->local_box();
    for (size_t d = 0; d < box.offsets.size(); ++d) t = t.narrow(static_cast<int64_t>(d), box.offsets[d], box.lengths[d]);
    return t;
  };
  at::NoGradGuard no_grad;
  std::set<const c10::TensorImpl*> done;
  for (FSDPUnit* unit : found.units) {
    unit->reshard();
    for (size_t i = 0; i < unit->params().size(); ++i) {
      unit->load_full(i, piece_of(found.key(*unit, unit->params()[i])).to(at::kFloat));
      done.insert(unit->params()[i].param.unsafeGetTensorImpl());
    }
  }
  for (const auto& item : root.named_parameters()) {
    if (done.insert(item.value().unsafeGetTensorImpl()).second) item.value().copy_(piece_of(item.key()));
  }
}

void load_parameters(torch::nn::Module& root, const ParameterBoxReader& read) {
  at::NoGradGuard no_grad;
  std::set<const c10::TensorImpl*> done;
  const UnitsAndPaths found = units_under(root);
  for (FSDPUnit* unit : found.units) {
    unit->reshard();
    for (size_t i = 0; i < unit->params().size(); ++i) {
      const ShardedParam& sp = unit->params()[i];
      done.insert(sp.param.unsafeGetTensorImpl());
      if (sp.local_rows == 0) continue;
      const std::string name = found.key(*unit, sp);
      const at::Tensor rows = read(name, global_box(root, name, sp.shape, sp.shard_dim, unit->first_row(i), sp.local_rows));
      unit->load_local_rows(i, rows);
    }
  }
  for (const auto& item : root.named_parameters()) {
    if (!done.insert(item.value().unsafeGetTensorImpl()).second) continue;
    at::Tensor param = item.value();
    param.copy_(read(item.key(), dtensor::parameter_box(root, item.key(), param.sizes().vec())).reshape(param.sizes()));
  }
}

}  // namespace hyperparallel::fsdp
