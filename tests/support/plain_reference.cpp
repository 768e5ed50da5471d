#include "plain_reference.h"

#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <cmath>

#include "hyperparallel/data/batch_sampler.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/models/causal_lm.h"
#include "hyperparallel/optim/muon.h"
#include "hyperparallel/train/lr_schedule.h"
#include "train/optimizer_setup.h"
#include "train/train_data.h"
#include "train/train_step.h"

namespace hyperparallel::testing {
namespace {

// AdamW with decay and no-decay groups, or (optim: muon) a one-process Muon for the matrices
// and AdamW for the rest.
std::unique_ptr<torch::optim::AdamW> plain_optimizer(const train::TrainConfig& c, models::CausalLM& model) {
  const bool muon = c.optim == "muon";
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    if (muon && optim::takes_muon(name, item.value().sizes().vec())) continue;
    const bool bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    (name.find("norm") != std::string::npos || bias ? no_decay : decay).push_back(item.value());
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
    return std::make_unique<optim::Muon>(groups, *options(c.weight_decay), model, train::muon_options(c), nullptr);
  }
  return std::make_unique<torch::optim::AdamW>(groups, *options(c.weight_decay));
}

}  // namespace

PlainRun plain_reference_run(const train::TrainConfig& c) {
  const train::TrainData data = train::prepare_train_data(c);
  models::ModelLoadOptions load;
  load.seed = static_cast<uint64_t>(c.seed);
  auto model = models::AutoModelForCausalLM::from_pretrained(c.model_name_or_path, load);
  std::unique_ptr<torch::optim::AdamW> optimizer_ptr = plain_optimizer(c, *model);
  torch::optim::AdamW& optimizer = *optimizer_ptr;
  std::vector<double> group_lr;  // each group's lr follows the schedule's factor
  for (const auto& group : optimizer.param_groups()) group_lr.push_back(static_cast<const torch::optim::AdamWOptions&>(group.options()).lr());
  const data::GlobalBatchSampler sampler(static_cast<int64_t>(data.rows.size()),
                                         c.per_device_train_batch_size * c.gradient_accumulation_steps,
                                         static_cast<uint64_t>(c.seed));
  const train::LrSchedule schedule = train::lr_schedule_for(c, c.max_steps);
  PlainRun run;
  const auto evaluate = [&](int64_t steps_done) {
    at::NoGradGuard no_grad;
    std::vector<data::TrainingRow> held;
    double tokens = 0;
    for (int64_t i = 0; i < data.eval_rows.size(); ++i) {
      held.push_back(data.eval_rows.row(i));
      tokens += static_cast<double>(data::label_tokens(held.back()));
    }
    std::vector<const data::TrainingRow*> rows;
    for (const auto& row : held) rows.push_back(&row);
    const models::CausalLMOutput out = model->forward(train::model_input(data::collate_rows(rows, data.pad_id)));
    run.eval_losses.emplace_back(steps_done, out.lm_loss_sum.item<double>() / tokens);
  };
  const int64_t eval_every = c.eval_steps >= 1 ? static_cast<int64_t>(c.eval_steps) : c.logging_steps;
  if (c.eval_on_start) evaluate(0);
  data::SamplerPosition position;
  for (int64_t step = 0; step < c.max_steps; ++step) {
    const std::vector<int64_t> picked = sampler.global_batch_rows(position);
    int64_t label_tokens = 0;
    for (int64_t r : picked) label_tokens += data.rows.label_tokens(r);
    position = sampler.next(position);
    const models::CausalLMOutput out = model->forward(train::model_input(data::collate_rows(data.rows, picked, data.pad_id)));
    // MoE: HF's load-balancing loss over the whole global batch (one forward here).
    const at::Tensor lm_loss = out.lm_loss_sum / static_cast<double>(label_tokens);
    const at::Tensor loss = out.aux_loss.defined() ? lm_loss + model->config().router_aux_loss_coef * out.aux_loss : lm_loss;
    if (out.aux_loss.defined()) run.aux_losses.push_back(out.aux_loss.item<double>());
    optimizer.zero_grad();
    loss.backward();
    const double norm = torch::nn::utils::clip_grad_norm_(model->parameters(), c.max_grad_norm > 0 ? c.max_grad_norm : INFINITY);
    for (size_t g = 0; g < group_lr.size(); ++g) {
      static_cast<torch::optim::AdamWOptions&>(optimizer.param_groups()[g].options()).lr(group_lr[g] * schedule.lr_at(step) / c.learning_rate);
    }
    optimizer.step();
    run.losses.push_back(loss.item<double>());
    run.grad_norms.push_back(norm);
    if ((c.eval_strategy == "steps" && (step + 1) % eval_every == 0) || (step + 1 == c.max_steps && c.do_eval)) evaluate(step + 1);
  }
  return run;
}

}  // namespace hyperparallel::testing
