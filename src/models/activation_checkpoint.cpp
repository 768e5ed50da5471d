// Activation checkpointing of decoder layers. See models/activation_checkpoint.h.
#include "hyperparallel/models/activation_checkpoint.h"

#include "decoder.h"
#include "hyperparallel/models/causal_lm.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::models {

std::vector<int64_t> apply_activation_checkpointing(CausalLM& model, const ActivationCheckpointOptions& options) {
  if (options.mode != "off" && options.mode != "full") {
    throw UserError("activation checkpointing mode '" + options.mode + "' is not one of off | full");
  }
  if (options.every < 1) throw UserError("activation checkpointing every " + std::to_string(options.every) + " must be >= 1");
  std::vector<int64_t> checkpointed;
  auto& layers = model.backbone().decoder_layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    const bool on = options.mode == "full" && static_cast<int64_t>(i) % options.every == 0;
    layers[i]->recompute = on;
    if (on) checkpointed.push_back(static_cast<int64_t>(i));
  }
  return checkpointed;
}

}  // namespace hyperparallel::models
