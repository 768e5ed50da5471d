// Activation checkpointing of decoder layers. See models/activation_checkpoint.h.
#include "hyperparallel/models/activation_checkpoint.h"

#include "activation_swap.h"
#include "attention.h"
#include "decoder.h"
#include "hyperparallel/models/causal_lm.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::models {

std::vector<int64_t> apply_activation_checkpointing(CausalLM& model, const ActivationCheckpointOptions& options) {
  if (options.mode != "off" && options.mode != "full" && options.mode != "selective") {
    throw UserError("activation checkpointing mode '" + options.mode + "' is not one of off | full | selective");
  }
  if (options.every < 1) throw UserError("activation checkpointing every " + std::to_string(options.every) + " must be >= 1");
  if (options.selective_policy != "op" && options.selective_policy != "attention_core") {
    throw UserError("selective activation checkpointing policy '" + options.selective_policy + "' is not one of op | attention_core");
  }
  if (options.swap_inputs && options.mode != "full") {
    throw UserError("activation swap moves the inputs full checkpointing keeps; with mode " + options.mode +
                    " there are none: use mode full or turn swap_inputs off");
  }
  const bool core_only = options.mode == "selective" && options.selective_policy == "attention_core";
  const auto pool = options.swap_inputs ? std::make_shared<ActivationSwapPool>() : nullptr;
  std::vector<int64_t> checkpointed;
  auto& layers = model.backbone().decoder_layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    const int64_t index = layers[i]->index();  // in the whole model (a pipeline stage holds some)
    const bool on = options.mode != "off" && index % options.every == 0;
    layers[i]->recompute = on && !core_only;
    layers[i]->keep_linear_outputs = on && options.mode == "selective" && !core_only;
    layers[i]->swap = layers[i]->recompute ? pool : nullptr;  // null without swap_inputs
    auto* attention = dynamic_cast<Attention*>(layers[i]->self_attn.get());
    if (on && core_only && !attention) {
      throw UserError("selective activation checkpointing with policy attention_core recomputes the eager attention core; layer " +
                      std::to_string(index) + "'s attention is " + layers[i]->self_attn->name() +
                      " (a plan override): use policy op, mode full, or drop the override");
    }
    if (attention) attention->recompute_core = on && core_only;
    if (on) checkpointed.push_back(index);
  }
  return checkpointed;
}

ActivationSwapTraffic activation_swap_traffic(CausalLM& model) {
  for (const auto& layer : model.backbone().decoder_layers) {
    if (layer->swap) return layer->swap->traffic();
  }
  return {};
}

}  // namespace hyperparallel::models
