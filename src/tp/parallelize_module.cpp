#include "hyperparallel/tp/parallelize_module.h"

#include <fnmatch.h>
#include <torch/nn/module.h>

#include "hyperparallel/dtensor/parameter_specs.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/tp/placement_checks.h"

namespace hyperparallel::tp {

ParameterLayouts parallelize_module(torch::nn::Module& root, const mesh::DeviceMesh& tp_mesh, const ParallelizePlan& plan,
                                    const ParallelizeOptions& options) {
  if (tp_mesh.ndim() != 1) {
    throw UserError("parallelize_module: the tp mesh must have one axis, got " + tp_mesh.to_string() + "; pass mesh[\"tp\"]");
  }
  auto ctx = std::make_shared<TensorParallelContext>(tp_mesh);
  ctx->validate_placement = options.validate_placement;
  ctx->pipeline_stage = options.pipeline_stage;
  // Match every key first, so hooks attached by one entry are never matched by the next.
  const auto modules = root.named_modules("", /*include_self=*/false);
  std::vector<std::vector<std::pair<std::string, torch::nn::Module*>>> matches;
  for (const auto& [pattern, style] : plan.entries()) {
    matches.emplace_back();
    for (const auto& item : modules) {
      if (fnmatch(pattern.c_str(), item.key().c_str(), 0) == 0) matches.back().emplace_back(item.key(), item.value().get());
    }
    if (matches.back().empty() && !options.pipeline_stage) {
      throw UserError("tensor parallel plan: '" + pattern + "' (" + style->name() +
                      ") matches no module of this model; module names look like 'model.layers.0.self_attn.q_proj'");
    }
  }
  ParameterLayouts layouts;
  for (size_t i = 0; i < matches.size(); ++i) {
    for (const auto& [path, module] : matches[i]) {
      const std::string style = plan.entries()[i].second->name();
      std::string& styles = ctx->styles[path];
      styles += (styles.empty() ? "" : " + ") + style;
      plan.entries()[i].second->apply(*module, path, ctx, layouts);
    }
  }
  if (options.validate_placement) attach_placement_checks(root, ctx, layouts);
  // Split parameters carry their spec on the model (dtensor/parameter_specs.h), so FSDP, the
  // state dicts and checkpoints see the global layout.
  for (const auto& [name, spec] : layouts) {
    if (spec.placements()[0].is_shard()) dtensor::record_parameter_spec(root, name, spec);
  }
  return layouts;
}

}  // namespace hyperparallel::tp
