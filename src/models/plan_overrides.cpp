// Module replacement by name and type. See models/plan_overrides.h.
#include "hyperparallel/models/plan_overrides.h"

#include <fnmatch.h>
#include <torch/nn/module.h>

#include <set>

#include "fused_attention.h"
#include "fused_rms_norm.h"
#include "fused_swiglu.h"
#include "grouped_experts.h"
#include "hyperparallel/models/module_interfaces.h"
#include "hyperparallel/platform/suggest.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::models {
ReplacementRegistry ReplacementRegistry::with_builtins() {
  ReplacementRegistry r;
  r.add("fused_qkv_attention", make_fused_qkv_attention);
  r.add("fused_rms_norm", make_fused_rms_norm);
  r.add("fused_swiglu_mlp", make_fused_swiglu_mlp);
  r.add("grouped_experts", make_grouped_experts);
  return r;
}

void ReplacementRegistry::add(const std::string& name, ReplacementFactory factory) {
  if (name.empty() || !factory) throw UserError("a replacement needs a name and a factory");
  factories_[name] = std::move(factory);
}

const ReplacementFactory& ReplacementRegistry::find(const std::string& name) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    throw UserError("replace_module '" + name + "' is not a registered replacement; registered: " + join_names(names()));
  }
  return it->second;
}

std::vector<std::string> ReplacementRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& item : factories_) out.push_back(item.first);
  return out;
}

std::vector<std::string> apply_plan_overrides(torch::nn::Module& model, const ModelConfig& config,
                                              const std::vector<PlanOverride>& overrides, const ReplacementRegistry& registry) {
  std::vector<std::string> replaced;
  for (size_t i = 0; i < overrides.size(); ++i) {
    const PlanOverride& o = overrides[i];
    const std::string where = "plan_overrides[" + std::to_string(i) + "] (match '" + o.match + "', module_type '" +
                              o.module_type + "', replace_module '" + o.replace_module + "')";
    const ReplacementFactory* factory = nullptr;
    try {
      factory = &registry.find(o.replace_module);
    } catch (const UserError& e) {
      throw UserError(where + ": " + e.what());
    }
    auto modules = model.named_modules();
    std::set<std::string> types;
    std::vector<std::string> targets;
    for (const auto& item : modules) {
      types.insert(item.value()->name());
      if (item.value()->name() == o.module_type && fnmatch(o.match.c_str(), item.key().c_str(), 0) == 0) {
        targets.push_back(item.key());
      }
    }
    if (!types.count(o.module_type)) {
      throw UserError(where + ": this model has no module of type '" + o.module_type + "'; its types: " +
                      join_names(std::vector<std::string>(types.begin(), types.end())));
    }
    if (targets.empty()) {
      throw UserError(where + ": no module of type " + o.module_type + " has a name matching '" + o.match +
                      "' (names look like model.layers.0.self_attn; use * for any part)");
    }
    for (const auto& name : targets) {
      const size_t dot = name.rfind('.');
      if (dot == std::string::npos) throw UserError(where + ": the root module cannot be replaced");
      auto* slots = dynamic_cast<ModuleSlots*>(modules[name.substr(0, dot)].get());
      if (!slots) throw UserError(where + ": " + name + " sits in a module that does not allow replacing its children");
      std::shared_ptr<torch::nn::Module> replacement;
      try {
        replacement = (*factory)(*modules[name], config);
      } catch (const UserError& e) {
        throw UserError(where + ": " + e.what());
      }
      slots->replace_child(name.substr(dot + 1), replacement);
      replaced.push_back(name);
    }
  }
  return replaced;
}

}  // namespace hyperparallel::models
