// plan_overrides: declarative replacement of a model's modules with other implementations.
//
// An override {match, module_type, replace_module} replaces every module whose full name
// matches the glob `match` (fnmatch: `*` also crosses dots, so "*.self_attn" matches
// "model.layers.3.self_attn") and whose type (its HF class name, e.g. Qwen3Attention) is
// `module_type`, by what the registered factory `replace_module` builds from it. Overrides
// apply in order, when the model is built and before weights load; a replacement adopts
// the original's parameters, so names, shapes and checkpoints are unchanged.
// The registry is a value passed in (no global table): with_builtins() holds
//   fused_qkv_attention  one GEMM for q, k and v; grouped KV heads without copies; scores
//                        scaled and masked in place
//   fused_rms_norm       one pass over each row forward and backward (fp32)
//   grouped_experts      a sparse MoE block's pairs sorted by expert once, each expert on its
//                        contiguous rows, one scatter-add (src/models/grouped_experts.h)
// and users add their own. Every mistake is a UserError that lists what exists: unknown
// replacement names, types the model does not have, a glob that matches nothing.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hyperparallel/models/model_config.h"

namespace torch::nn {
class Module;
}

namespace hyperparallel::models {

struct PlanOverride {
  std::string match;           // glob on the module's full name
  std::string module_type;     // its class name, e.g. Qwen3Attention, Qwen3RMSNorm
  std::string replace_module;  // a name in the registry
};

// Builds the replacement for `original` (throws UserError when it cannot replace that type).
using ReplacementFactory =
    std::function<std::shared_ptr<torch::nn::Module>(torch::nn::Module& original, const ModelConfig& config)>;

class ReplacementRegistry {
 public:
  static ReplacementRegistry with_builtins();
  void add(const std::string& name, ReplacementFactory factory);
  const ReplacementFactory& find(const std::string& name) const;  // UserError listing names
  std::vector<std::string> names() const;

 private:
  std::map<std::string, ReplacementFactory> factories_;
};

// Applies `overrides` to `model` in order; returns the full names of the replaced modules.
std::vector<std::string> apply_plan_overrides(torch::nn::Module& model, const ModelConfig& config,
                                              const std::vector<PlanOverride>& overrides, const ReplacementRegistry& registry);

}  // namespace hyperparallel::models
