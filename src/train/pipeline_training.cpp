// Pipeline parallelism in the trainer. See pipeline_training.h.
#include "pipeline_training.h"

#include <ATen/ATen.h>

#include <map>

#include "hyperparallel/fsdp/clip_grad_norm.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/pp/stage_split.h"
#include "models/moe.h"
#include "train_step.h"

namespace hyperparallel::train {

int64_t pipeline_microbatches(const TrainConfig& c) {
  return c.accelerator.pp_microbatches.value_or(c.gradient_accumulation_steps);
}

PipelinePlan plan_pipeline(const TrainConfig& c, const models::ModelConfig& config) {
  const AcceleratorConfig& a = c.accelerator;
  const int64_t stages = a.pp_size * a.pp_virtual_stages;
  PipelinePlan plan;
  try {
    plan.split = a.pp_layers.empty() ? pp::balanced_split(config.num_hidden_layers, stages)
                                     : pp::explicit_split(a.pp_layers, config.num_hidden_layers, stages);
    plan.schedule = pp::make_schedule(a.pp_schedule, a.pp_size, pipeline_microbatches(c), a.pp_virtual_stages,
                                      pp::layer_costs(config, c.cutoff_len));
  } catch (const UserError& e) {
    throw UserError(std::string("accelerator.pp_*: ") + e.what());
  }
  if (plan.schedule.splits_backward()) {
    const std::string why = " recomputes or chunks inside its backward, which computes weight gradients in the input-gradient "
                            "pass the zero_bubble schedule separates; use pp_schedule 1f1b (or interleaved_1f1b) or turn it off";
    if (activation_checkpoint_mode(c) != "off") throw UserError("activation checkpointing" + why);
    if (c.chunked_loss.enabled.value_or(false)) throw UserError("chunked_loss" + why);
    if (c.bf16 || c.fsdp_config.mix_precision.param_dtype != "float32") {
      throw UserError("pp_schedule zero_bubble with bf16 parameters under FSDP is not supported yet (the weight pass finds the "
                      "parameters' gradient accumulators, which the dtype change replaces); use 1f1b or fp32");
    }
  }
  if (config.num_experts > 0 && config.output_router_logits && c.moe_aux_loss_scope != "global") {
    throw UserError("moe_aux_loss_scope micro_batch with pp_size > 1 is not supported yet (a micro-batch's routing spans the "
                    "stages); use moe_aux_loss_scope: global");
  }
  if (c.heldout_eval_samples > 0) {
    throw UserError("heldout_eval_samples generates answers with the whole model, which pp_size > 1 splits over ranks; set "
                    "heldout_eval_samples: 0 (the exported folder generates)");
  }
  return plan;
}

// MoE routing statistics of each micro-batch, pooled over every rank (see the header).
class PipelineTraining::RoutingPool {
 public:
  RoutingPool(const models::ModelConfig& config, comm::Communicator& world, int64_t tp, size_t local_stages)
      : config_(config), world_(world), tp_(tp), local_stages_(local_stages) {}

  void start_step(const std::vector<models::CausalLMInput>& microbatches, double aux_coef) {
    inputs_ = &microbatches;
    aux_coef_ = aux_coef;
    pending_.clear();
    value_sum_ = 0;
  }

  void after_forward(int64_t m, int64_t stage, const models::SpanOutput& out) {
    Pending& p = pending_[m];
    const models::RoutingSums& own = p.own[stage] = own_sums(m, out);  // prob_sums keep their graph for backward
    const at::Tensor v = routing_vector(own);
    p.sums = p.sums.defined() ? p.sums + v : v;
    if (++p.stages_done == local_stages_) p.reduce = world_.all_reduce(p.sums);
  }

  at::Tensor extra_loss(int64_t m, int64_t stage, const models::SpanOutput& out) {
    Pending& p = pending_.at(m);
    if (!p.reduced) {
      p.reduce.wait();
      p.reduced = true;
      value_sum_ += pooled_aux(p.sums, at::zeros({config_.num_experts}, at::kDouble), config_.num_experts, tp_).value;
    }
    if (out.router_logits.empty()) return {};
    return pooled_aux(p.sums, p.own.at(stage).prob_sums, config_.num_experts, tp_).own_part * aux_coef_;
  }

  double value_sum() const { return value_sum_; }

 private:
  struct Pending {
    at::Tensor sums;
    std::map<int64_t, models::RoutingSums> own;  // per local stage
    size_t stages_done = 0;
    comm::CommHandle reduce;
    bool reduced = false;
  };
  const models::ModelConfig& config_;
  comm::Communicator& world_;
  int64_t tp_;
  size_t local_stages_;
  const std::vector<models::CausalLMInput>* inputs_ = nullptr;
  double aux_coef_ = 0;
  std::map<int64_t, Pending> pending_;
  double value_sum_ = 0;

  // A span without sparse layers contributes nothing (zeros of the right size).
  models::RoutingSums own_sums(int64_t m, const models::SpanOutput& out) const {
    const int64_t experts = config_.num_experts, k = config_.num_experts_per_tok;
    if (out.router_logits.empty()) return {at::zeros({k, experts}), at::zeros({experts}), 0.0};
    return models::routing_sums(out.router_logits, experts, k, (*inputs_)[static_cast<size_t>(m)].attention_mask);
  }
};

PipelineTraining::PipelineTraining(models::CausalLM& model, PipelinePlan plan, const ParallelLayout& layout, fsdp::FSDPModule root,
                                   std::shared_ptr<comm::Communicator> world, const TrainConfig& c)
    : model_(model), plan_(std::move(plan)), root_(root), pp_group_(layout.mesh.comm("pp")), tp_(layout.tp()), pp_(layout.dims.pp) {
  const auto& pp_group = pp_group_;
  const int64_t first = plan_.schedule.rank_of(0), last = plan_.schedule.rank_of(plan_.schedule.stages() - 1);
  if (model.tied() && first != last && (pp_group->rank() == first || pp_group->rank() == last)) {
    const auto& members = pp_group->global_ranks();
    tied_group_ = pp_group->group({members[static_cast<size_t>(first)], members[static_cast<size_t>(last)]}, "pp_tied_embedding");
  }
  pp::PipelineHooks hooks;
  hooks.before_weight_backward = [this](int64_t, bool last_one) { root_.set_requires_gradient_sync(last_one); };
  hooks.before_input_backward = [this](int64_t) { root_.set_requires_gradient_sync(false); };
  if (c.bf16 || c.fsdp_config.mix_precision.param_dtype == "bfloat16") hooks.boundary_dtype = at::kBFloat16;
  if (c.accelerator.sequence_parallel) {
    const int64_t hidden = model.config().hidden_size, tp = tp_;
    hooks.boundary_shape = [hidden, tp](const models::CausalLMInput& in) {
      return std::vector<int64_t>{in.input_ids.size(0), in.input_ids.size(1) / tp, hidden};
    };
  }
  const bool pooled_aux = model.config().num_experts > 0 && model.config().output_router_logits;
  if (pooled_aux) {
    const size_t local = pp::stages_of_rank(pp_group->rank(), plan_.schedule.ranks, plan_.schedule.virtual_stages).size();
    routing_ = std::make_unique<RoutingPool>(model.config(), *world, tp_, local);
    hooks.after_forward = [this](int64_t m, int64_t s, const models::SpanOutput& out) { routing_->after_forward(m, s, out); };
    hooks.extra_loss = [this](int64_t m, int64_t s, const models::SpanOutput& out) { return routing_->extra_loss(m, s, out); };
  }
  stage_ = std::make_unique<pp::PipelineStage>(model, plan_.split, plan_.schedule, pp_group, std::move(hooks));
}

PipelineTraining::~PipelineTraining() = default;

PipelineTraining::Outcome PipelineTraining::run(const std::vector<models::CausalLMInput>& microbatches, double loss_scale,
                                                double aux_coef) {
  if (routing_) routing_->start_step(microbatches, aux_coef);
  Outcome outcome;
  outcome.lm_loss_sum = stage_->run(microbatches, loss_scale).lm_loss_sum;
  if (routing_) outcome.aux_sum = routing_->value_sum();
  sum_tied_gradients();
  return outcome;
}

std::pair<double, int64_t> PipelineTraining::evaluate(const std::vector<models::CausalLMInput>& microbatches) {
  const pp::PipelineStepResult result = stage_->evaluate(microbatches);
  return {result.lm_loss_sum, result.label_tokens};
}

void PipelineTraining::sum_tied_gradients() {
  if (!tied_group_) return;
  for (const auto& item : model_.named_parameters()) {
    if (item.key() != "model.embed_tokens.weight") continue;
    at::Tensor grad = item.value().grad();
    if (!grad.defined()) grad = item.value().mutable_grad() = at::zeros_like(item.value());
    tied_group_->all_reduce(grad).wait();
  }
}

std::map<std::string, at::Tensor> PipelineTraining::gather_parameters() {
  std::map<std::string, at::Tensor> full = fsdp::full_parameters(model_);  // collective inside the stage
  if (pp_group_->global_ranks().front() != 0) return {};  // not a stage's first rank
  // What pp rank k holds, in its order: the same split applied to a model nothing is written to.
  const auto names_of = [&](int64_t k) {
    models::ModelLoadOptions deferred;
    deferred.deferred_init = true;
    auto layout = models::AutoModelForCausalLM::from_config(model_.config(), deferred);
    pp::keep_stages(*layout, plan_.split, k, plan_.schedule.ranks);
    std::vector<std::pair<std::string, std::vector<int64_t>>> out;
    for (const auto& item : layout->named_parameters()) out.emplace_back(item.key(), item.value().sizes().vec());
    return out;
  };
  const int me = pp_group_->rank();
  if (me != 0) {
    std::vector<at::Tensor> flat;
    for (const auto& [name, shape] : names_of(me)) flat.push_back(full.at(name).to(at::kFloat).reshape({-1}));
    pp_group_->send(at::cat(flat), 0).wait();
    return {};
  }
  for (int k = 1; k < pp_group_->size(); ++k) {
    const auto names = names_of(k);
    int64_t total = 0;
    for (const auto& [name, shape] : names) total += c10::multiply_integers(shape);
    at::Tensor buffer = at::empty({total}, at::kFloat);
    pp_group_->recv(buffer, k).wait();
    int64_t at_offset = 0;
    for (const auto& [name, shape] : names) {
      const int64_t n = c10::multiply_integers(shape);
      full.emplace(name, buffer.narrow(0, at_offset, n).view(shape));  // a tied copy is already here
      at_offset += n;
    }
  }
  return full;
}

std::vector<double> PipelineTraining::norm_weights(int64_t world_size) const {
  std::vector<double> weights = fsdp::gradient_norm_weights(model_, world_size, pp_);
  if (!tied_group_) return weights;
  size_t i = 0;
  for (const auto& item : model_.named_parameters()) {
    if (item.key() == "model.embed_tokens.weight") weights[i] *= 0.5;  // two stages hold it
    ++i;
  }
  return weights;
}

}  // namespace hyperparallel::train
