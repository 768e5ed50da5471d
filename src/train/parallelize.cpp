#include "parallelize.h"

#include <fnmatch.h>

#include <algorithm>

#include "hyperparallel/cp/context_parallel.h"
#include "hyperparallel/dtensor/parameter_specs.h"
#include "hyperparallel/ep/expert_parallel.h"
#include "hyperparallel/models/activation_checkpoint.h"
#include "hyperparallel/models/causal_lm.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/tp/loss_parallel.h"
#include "hyperparallel/tp/model_plans.h"
#include "loss_chunking.h"
#include "models/decoder.h"

namespace hyperparallel::train {
namespace {

fsdp::FullyShardOptions shard_options(const TrainConfig& c, const mesh::DeviceMesh& dp_mesh, models::CausalLM& model) {
  fsdp::FullyShardOptions o;
  o.mesh = dp_mesh;
  const int64_t raf = c.fsdp_config.reshard_after_forward;
  if (raf <= 1) {
    o.reshard_after_forward = raf == 1;
  } else {
    o.reshard_after_forward = static_cast<int>(raf);
  }
  o.comm_fusion = c.fsdp_config.comm_fusion;
  o.forward_prefetch_depth = static_cast<int>(c.fsdp_config.forward_prefetch_depth);
  o.backward_prefetch_depth = static_cast<int>(c.fsdp_config.backward_prefetch_depth);
  const auto dtype = [](const std::string& name) { return name == "bfloat16" ? at::kBFloat16 : at::kFloat; };
  const MixPrecisionConfig& mp = c.fsdp_config.mix_precision;
  const std::string param_dtype = c.bf16 && mp.param_dtype == "float32" ? "bfloat16" : mp.param_dtype;
  if (param_dtype != "float32") o.mp_policy.param_dtype = dtype(param_dtype);
  if (mp.reduce_dtype != "float32") o.mp_policy.reduce_dtype = dtype(mp.reduce_dtype);
  if (mp.output_dtype != "float32") o.mp_policy.output_dtype = dtype(mp.output_dtype);
  o.offload_policy.cpu_offload = c.fsdp_config.enable_offload;
  for (const auto& pattern : c.fsdp_config.replicate_params) {
    bool matched = false;
    for (const auto& item : model.named_parameters()) {
      if (fnmatch(pattern.c_str(), item.key().c_str(), 0) == 0) {
        o.replicate_params.push_back(item.value());
        matched = true;
      }
    }
    if (!matched) throw UserError("fsdp_config.replicate_params: '" + pattern + "' matches no parameter of the model");
  }
  return o;
}

// (dp_replicate?, dp_shard, cp?, tp?); with `fold_cp` the cp axis is merged into dp_shard
// (FSDP's view: cp is inner to dp_shard, so the merged axis is the same ranks).
mesh::DeviceMesh compact_mesh(const mesh::ParallelDims& d, const std::shared_ptr<comm::Communicator>& world, bool fold_cp = false) {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  if (d.pp > 1) shape.push_back(d.pp), names.push_back("pp");
  if (d.dp_replicate > 1) shape.push_back(d.dp_replicate), names.push_back("dp_replicate");
  shape.push_back(fold_cp ? d.dp_shard * d.cp : d.dp_shard), names.push_back(fold_cp ? "dp_shard_cp" : "dp_shard");
  if (d.cp > 1 && !fold_cp) shape.push_back(d.cp), names.push_back("cp");
  if (d.tp > 1) shape.push_back(d.tp), names.push_back("tp");
  return mesh::init_device_mesh(world, "cpu", shape, names);
}

// The mesh's data axes: (dp_replicate, <shard axis>) or the shard axis alone.
mesh::DeviceMesh data_axes(const mesh::DeviceMesh& m, const mesh::ParallelDims& d, const std::string& shard_axis) {
  return d.dp_replicate > 1 ? m[{"dp_replicate", shard_axis}] : m[shard_axis];
}

mesh::DeviceMesh compact_expert_mesh(const mesh::ParallelDims& d, const std::shared_ptr<comm::Communicator>& world) {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  if (d.pp > 1) shape.push_back(d.pp), names.push_back("pp");
  if (d.dp_replicate > 1) shape.push_back(d.dp_replicate), names.push_back("dp_replicate");
  shape.push_back(d.edp_shard), names.push_back("edp");
  shape.push_back(d.ep), names.push_back("ep");
  return mesh::init_device_mesh(world, "cpu", shape, names);
}

void check_experts_fit(const models::ModelConfig& config, int64_t ep) {
  if (config.num_experts <= 0) {
    throw UserError("accelerator.ep_size " + std::to_string(ep) + " divides the experts of a mixture-of-experts model, and " +
                    config.model_type + " has none; set ep_size: 1");
  }
  if (config.num_experts % ep != 0) {
    throw UserError("accelerator.ep_size " + std::to_string(ep) + " does not divide the model's num_experts (" +
                    std::to_string(config.num_experts) + "); valid ep sizes: " +
                    ep::valid_ep_sizes(config.num_experts, config.num_experts));
  }
}

// Backward prefetch with expert units nested in their layers. The recorded forward order
// [L0, E0, L1, E1, ...] would have each unit prefetch the one recorded before it, so L_i would
// gather E_(i-1) for the whole of its backward and gather itself only when needed. In backward
// a layer unit's experts run first, last layer first (the MoE block ends a layer), each before
// the attention under it: so a unit G holding layers a..b runs backward as [G, E_b, ..., E_a],
// each entry prefetching the next, and the last entry prefetches the previous unit and its
// first experts, which then arrive while the attention of layer a runs backward. Over the
// layers this rank holds (a pipeline stage holds some), `layers_per_unit` of them per unit.
void order_backward_prefetch(models::CausalLM& model, std::vector<fsdp::FSDPModule>& units, size_t expert_units,
                             size_t layers_per_unit) {
  const auto& held = model.backbone().decoder_layers;
  std::vector<std::vector<fsdp::FSDPModule>> backward_runs;  // per layer unit, first layer unit first
  size_t next_expert = 0;
  for (size_t first = 0; first < held.size(); first += layers_per_unit) {
    std::vector<fsdp::FSDPModule> run = {units[expert_units + backward_runs.size()]};
    const size_t end = std::min(held.size(), first + layers_per_unit);
    std::vector<fsdp::FSDPModule> experts;
    for (size_t i = first; i < end && next_expert < expert_units; ++i) {
      if (model.config().is_moe_layer(held[i]->index())) experts.push_back(units[next_expert++]);
    }
    run.insert(run.end(), experts.rbegin(), experts.rend());
    backward_runs.push_back(std::move(run));
  }
  for (size_t g = 0; g < backward_runs.size(); ++g) {
    auto& run = backward_runs[g];
    for (size_t j = 0; j + 1 < run.size(); ++j) run[j].set_modules_to_backward_prefetch({run[j + 1]});
    std::vector<fsdp::FSDPModule> previous;
    if (g > 0) {
      const auto& before = backward_runs[g - 1];
      previous.assign(before.begin(), before.begin() + std::min<size_t>(2, before.size()));
    }
    run.back().set_modules_to_backward_prefetch(previous);
  }
}

// Under EP the experts are sharded over edp whatever fsdp_config.replicate_params says: a
// pattern that names only expert parameters would do nothing, so it is an error.
void check_replicate_params_are_dense(const TrainConfig& c, models::CausalLM& model) {
  const auto& experts = dtensor::parameter_owners(model);
  for (const auto& pattern : c.fsdp_config.replicate_params) {
    bool dense = false;
    for (const auto& item : model.named_parameters()) {
      if (!experts.count(item.key()) && fnmatch(pattern.c_str(), item.key().c_str(), 0) == 0) dense = true;
    }
    if (!dense) {
      throw UserError("fsdp_config.replicate_params: '" + pattern + "' matches only expert parameters, which expert parallelism "
                      "shards over the edp ranks; remove it or name dense parameters");
    }
  }
}

// Expert parallelism over layout.expert_mesh["ep"]; the tp ranks split their shared tokens.
void parallelize_experts(models::CausalLM& model, const ParallelLayout& layout) {
  check_experts_fit(model.config(), layout.dims.ep);
  ep::ExpertParallelOptions options;
  if (layout.tp() > 1) options.token_split = layout.mesh.comm("tp");
  ep::parallelize_experts(model, (*layout.expert_mesh)["ep"], options);
}

}  // namespace

std::string activation_checkpoint_mode(const TrainConfig& c) {
  if (c.disable_gradient_checkpointing) return "off";
  return c.gradient_checkpointing ? "full" : c.activation_checkpoint.mode;
}

ParallelLayout build_layout(const TrainConfig& c, const std::shared_ptr<comm::Communicator>& world) {
  const int64_t n = world->size(), tp = c.accelerator.tp_size, cp = c.accelerator.cp_size, pp = c.accelerator.pp_size;
  if (n % (tp * cp * pp) != 0) {
    std::string degrees = "accelerator.tp_size " + std::to_string(tp);
    if (cp > 1) degrees += " x cp_size " + std::to_string(cp);
    if (pp > 1) degrees += " x pp_size " + std::to_string(pp);
    if (cp > 1 || pp > 1) degrees += " = " + std::to_string(tp * cp * pp);
    throw UserError(degrees + " does not divide the world size " + std::to_string(n) + "; use " +
                    (cp == 1 && pp == 1 ? "a divisor of it" : "degrees whose product divides it"));
  }
  const int64_t dp = n / (tp * cp * pp);
  const int64_t shard = c.fsdp_config.dp_shard_size == -1 ? dp : c.fsdp_config.dp_shard_size;
  if (shard > dp || dp % shard != 0) {
    throw UserError("fsdp_config.dp_shard_size: " + std::to_string(shard) + " does not divide the " + std::to_string(dp) +
                    " data-parallel ranks (world " + std::to_string(n) + " / tp_size " + std::to_string(tp) +
                    (cp > 1 ? " / cp_size " + std::to_string(cp) : "") + (pp > 1 ? " / pp_size " + std::to_string(pp) : "") + "); use a divisor of it (the rest become replicas, HSDP) or -1 for all");
  }
  mesh::ParallelDims dims;
  dims.dp_replicate = dp / shard;
  dims.dp_shard = shard;
  dims.cp = cp;
  dims.tp = tp;
  dims.pp = pp;
  dims.ep = c.accelerator.ep_size;
  dims.edp_shard = c.fsdp_config.edp_shard_size;
  try {
    dims = dims.resolved(n);
  } catch (const UserError& e) {
    throw UserError(std::string("accelerator.ep_size / fsdp_config.edp_shard_size: ") + e.what());
  }
  mesh::DeviceMesh full = compact_mesh(dims, world);
  mesh::DeviceMesh data_mesh = data_axes(full, dims, "dp_shard");
  mesh::DeviceMesh dp_mesh = cp > 1 ? data_axes(compact_mesh(dims, world, true), dims, "dp_shard_cp") : data_mesh;
  ParallelLayout layout{dims, std::move(full), std::move(data_mesh), std::move(dp_mesh), std::nullopt, std::nullopt};
  if (dims.ep > 1) {
    layout.expert_mesh = compact_expert_mesh(dims, world);
    layout.edp_mesh = dims.dp_replicate > 1 ? (*layout.expert_mesh)[{"dp_replicate", "edp"}] : (*layout.expert_mesh)["edp"];
  }
  return layout;
}

ParallelModel parallelize(models::CausalLM& model, const ParallelLayout& layout, const TrainConfig& c) {
  if (layout.tp() > 1) {
    if (!c.plan_overrides.empty()) {
      throw UserError("plan_overrides with accelerator.tp_size > 1 is not supported yet: the fused modules have no "
                      "tensor-parallel plan; remove plan_overrides or set tp_size: 1");
    }
    tp::TensorParallelOptions options;
    options.sequence_parallel = c.accelerator.sequence_parallel;
    options.loss_parallel = c.accelerator.loss_parallel;
    tp::ParallelizeOptions mode;
    mode.validate_placement = c.validate_placement;
    mode.pipeline_stage = layout.dims.pp > 1;
    tp::parallelize_module(model, layout.mesh["tp"], tp::plan_for(model.config(), layout.tp(), options), mode);
    if (options.loss_parallel) tp::enable_loss_parallel(model, layout.mesh["tp"]);
  }
  if (layout.cp() > 1) {
    cp::ContextParallelOptions options{c.accelerator.cp_algorithm, c.accelerator.ulysses_degree, layout.tp()};
    try {
      cp::parallelize_context(model, layout.mesh.comm("cp"), options);
    } catch (const UserError& e) {
      throw UserError(std::string("accelerator.cp_size / cp_algorithm: ") + e.what());
    }
  }
  if (c.moe_capacity_factor > 0) {
    if (model.config().num_experts <= 0) {
      throw UserError("moe_capacity_factor applies to mixture-of-experts models, and " + model.config().model_type +
                      " has no experts; remove it");
    }
    ep::set_expert_capacity(model, c.moe_capacity_factor);
  }
  const std::string mode = activation_checkpoint_mode(c);
  if (c.activation_checkpoint.swap_inputs && mode != "full") {
    throw UserError("activation_checkpoint.swap_inputs moves the inputs full checkpointing keeps, and the mode is " + mode +
                    "; set activation_checkpoint.mode: full (or gradient_checkpointing: true) or remove swap_inputs");
  }
  models::apply_activation_checkpointing(
      model, {mode, c.activation_checkpoint.every, c.activation_checkpoint.swap_inputs, c.activation_checkpoint.selective_policy});
  model.set_loss_chunk_tokens(resolve_loss_chunking(c, model.config(), layout.cp()).chunk_tokens);
  const fsdp::FullyShardOptions shard = shard_options(c, layout.dp_mesh, model);
  ParallelModel out;
  if (layout.expert_mesh) {
    parallelize_experts(model, layout);
    fsdp::FullyShardOptions experts = shard;
    experts.mesh = *layout.edp_mesh;
    // reshard_after_forward: k names groups of the dense shard ranks; where k does not fit the
    // edp group the experts reshard fully.
    if (const int* k = std::get_if<int>(&experts.reshard_after_forward)) {
      const int64_t edp = layout.dims.edp_shard;
      if (*k >= edp || edp % *k != 0) experts.reshard_after_forward = true;
    }
    experts.replicate_params.clear();  // fsdp_config.replicate_params name dense parameters
    check_replicate_params_are_dense(c, model);
    for (auto* m : ep::expert_modules(model)) out.units.push_back(fsdp::fully_shard(*m, experts));
  }
  const size_t expert_units = out.units.size();
  const auto layers = model.decoder_layers();
  const auto per_unit = static_cast<size_t>(c.fsdp_config.layers_per_unit);
  for (size_t first = 0; first < layers.size(); first += per_unit) {
    const auto end = layers.begin() + static_cast<std::ptrdiff_t>(std::min(layers.size(), first + per_unit));
    out.units.push_back(fsdp::fully_shard(std::vector<torch::nn::Module*>(layers.begin() + static_cast<std::ptrdiff_t>(first), end), shard));
  }
  out.units.push_back(fsdp::fully_shard(model, shard));
  if (expert_units > 0 && shard.backward_prefetch_depth > 0) order_backward_prefetch(model, out.units, expert_units, per_unit);
  return out;
}

}  // namespace hyperparallel::train
