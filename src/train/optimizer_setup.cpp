// The trainer's optimizer. See optimizer_setup.h.
#include "optimizer_setup.h"

#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/models/causal_lm.h"

namespace hyperparallel::train {

optim::MuonOptions muon_options(const TrainConfig& c) {
  optim::MuonOptions o;
  o.lr = c.muon_config.lr.value_or(c.learning_rate);
  o.weight_decay = c.muon_config.weight_decay.value_or(c.weight_decay);
  o.momentum = c.muon_config.momentum;
  o.nesterov = c.muon_config.nesterov;
  o.ns_steps = c.muon_config.ns_steps;
  o.adjust_lr = c.muon_config.adjust_lr;
  return o;
}

// AdamW (fused, optim/fused_adamw.h) with HF's grouping: no weight decay on biases and norm
// weights.
std::unique_ptr<optim::FusedAdamW> make_optimizer(const TrainConfig& c, models::CausalLM& model,
                                                  const std::shared_ptr<comm::Communicator>& world) {
  const bool muon = c.optim == "muon";
  const auto shapes = muon ? fsdp::full_parameter_shapes(model) : std::map<std::string, std::vector<int64_t>>{};
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    if (muon && optim::takes_muon(name, shapes.at(name))) continue;  // Muon's own group
    const bool is_norm = name.find("norm") != std::string::npos;
    const bool is_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    (is_norm || is_bias ? no_decay : decay).push_back(item.value());
  }
  const auto options = [&](double wd) {
    auto o = std::make_unique<torch::optim::AdamWOptions>(c.learning_rate);
    o->betas({c.adam_beta1, c.adam_beta2}).eps(c.adam_epsilon).weight_decay(wd);
    return o;
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(c.weight_decay));
  if (!no_decay.empty()) groups.emplace_back(no_decay, options(0.0));
  if (muon) {
    return std::make_unique<optim::Muon>(groups, *options(c.weight_decay), model, muon_options(c), world);
  }
  // One pass per parameter instead of LibTorch's seven ops: 0.58x its step time at one
  // thread, 0.62x at two (docs/benchmarks.md "Optimizer"), the same numbers to rounding.
  return std::make_unique<hyperparallel::optim::FusedAdamW>(groups, *options(c.weight_decay));
}

}  // namespace hyperparallel::train
