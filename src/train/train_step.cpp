// One optimizer step. See train_step.h.
#include "train_step.h"

#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>

#include "hyperparallel/cp/context_parallel.h"
#include "hyperparallel/data/batch_sampler.h"
#include "hyperparallel/ep/expert_parallel.h"
#include "hyperparallel/fsdp/clip_grad_norm.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/models/causal_lm.h"
#include "models/moe.h"
#include "pipeline_training.h"

namespace hyperparallel::train {
namespace {

at::Tensor as_tensor(const std::vector<int64_t>& v, int64_t rows, int64_t length) {
  return at::tensor(v, at::kLong).view({rows, length});
}

}  // namespace

models::CausalLMInput model_input(const data::TokenBatch& batch, int64_t cp, int64_t cp_rank) {
  models::CausalLMInput in;
  in.input_ids = as_tensor(batch.input_ids, batch.rows, batch.length);
  in.labels = as_tensor(batch.labels, batch.rows, batch.length);
  in.attention_mask = as_tensor(batch.attention_mask, batch.rows, batch.length);
  in.position_ids = as_tensor(batch.position_ids, batch.rows, batch.length);
  return cp > 1 ? cp::shard_sequence(in, cp, cp_rank) : in;
}

at::Tensor routing_vector(const models::RoutingSums& own) {
  return at::cat({own.counts.detach().reshape({-1}).to(at::kDouble), own.prob_sums.detach().to(at::kDouble),
                  at::full({1}, own.tokens, at::kDouble)});
}

PooledAux pooled_aux(at::Tensor pooled, const at::Tensor& own_prob_sums, int64_t experts, int64_t tp) {
  pooled = pooled / static_cast<double>(tp);  // the ranks of a tensor-parallel group route the same tokens
  const int64_t slots = pooled.numel() - experts - 1;
  const at::Tensor per_expert = pooled.narrow(0, 0, slots).view({-1, experts}).sum(0);  // summed over the top-k slots
  const at::Tensor prob_sums = pooled.narrow(0, slots, experts);
  const double tokens = std::max(pooled[slots + experts].item<double>(), 1.0);
  const double scale = static_cast<double>(experts) / (tokens * tokens);
  PooledAux aux;
  aux.value = (per_expert * prob_sums).sum().item<double>() * scale;
  aux.own_part = (per_expert.to(own_prob_sums.scalar_type()) * own_prob_sums).sum() * scale;
  return aux;
}

namespace {

PooledAux pooled_aux_loss(const StepSetup& s, const models::CausalLMOutput& out, const at::Tensor& attention_mask) {
  const models::ModelConfig& config = s.model.config();
  const models::RoutingSums own = models::routing_sums(out.router_logits, config.num_experts, config.num_experts_per_tok, attention_mask);
  at::Tensor pooled = routing_vector(own);
  s.world.all_reduce(pooled).wait();
  return pooled_aux(pooled, own.prob_sums, config.num_experts, s.tp);
}

}  // namespace

StepOutcome run_optimizer_step(const StepSetup& s, const std::vector<int64_t>& global, double lr) {
  const TrainData& data = s.data;
  StepOutcome outcome;
  int64_t label_tokens = 0;
  for (int64_t r : global) {
    label_tokens += data.label_tokens[r];
    outcome.input_tokens += data.rows.length(r);
  }
  const double denominator = static_cast<double>(std::max<int64_t>(1, label_tokens));
  const double aux_coef = s.model.config().router_aux_loss_coef;
  double local_loss_sum = 0, aux_sum = 0;  // aux_sum: global values (same on every rank), or this rank's own
  ep::take_expert_load(s.model);            // count this step's routed pairs only
  const auto micro_batch = [&](int64_t m) {
    const auto mine = data::GlobalBatchSampler::rank_micro_batch(global, s.dp_rank, s.dp, m, s.accumulation);
    return model_input(data::collate_rows(data.rows, mine, data.pad_id), s.cp, s.cp_rank);
  };
  if (s.pipeline) {
    std::vector<models::CausalLMInput> inputs;
    for (int64_t m = 0; m < s.accumulation; ++m) inputs.push_back(micro_batch(m));
    const PipelineTraining::Outcome done = s.pipeline->run(inputs, 1.0 / denominator, aux_coef / static_cast<double>(s.accumulation));
    local_loss_sum = done.lm_loss_sum;
    aux_sum = done.aux_sum;
  }
  for (int64_t m = 0; m < s.accumulation && !s.pipeline; ++m) {
    const models::CausalLMInput in = micro_batch(m);
    s.root.set_requires_gradient_sync(m == s.accumulation - 1);
    const models::CausalLMOutput out = s.model.forward(in);
    at::Tensor loss = out.lm_loss_sum / denominator;
    if (out.aux_loss.defined() && s.global_aux_loss) {
      const PooledAux aux = pooled_aux_loss(s, out, in.attention_mask);
      loss = loss + aux.own_part * (aux_coef / static_cast<double>(s.accumulation));
      aux_sum += aux.value;
    } else if (out.aux_loss.defined()) {
      loss = loss + out.aux_loss * (aux_coef / static_cast<double>(s.accumulation * s.dp * s.cp));
      aux_sum += out.aux_loss.item<double>();
    }
    loss.backward();
    local_loss_sum += out.lm_loss_sum.item<double>();
  }
  // The squared gradient norm and the loss in one all-reduce.
  const ep::ExpertLoad load = ep::take_expert_load(s.model);
  at::Tensor sums = at::stack({fsdp::local_squared_gradient_norm(s.model, s.norm_weights), at::scalar_tensor(local_loss_sum, at::kDouble),
                               at::scalar_tensor(s.global_aux_loss ? 0.0 : aux_sum, at::kDouble),
                               at::scalar_tensor(static_cast<double>(load.routed), at::kDouble),
                               at::scalar_tensor(static_cast<double>(load.dropped), at::kDouble)});
  s.world.all_reduce(sums).wait();
  // tp ranks count the same pairs: the ratio is unchanged.
  outcome.dropped_fraction = sums[3].item<double>() > 0 ? sums[4].item<double>() / sums[3].item<double>() : 0.0;
  outcome.grad_norm = std::sqrt(sums[0].item<double>());
  outcome.lm_loss = sums[1].item<double>() / static_cast<double>(s.tp) / denominator;  // tp ranks share each micro-batch
  // The step's aux loss: the mean over micro-batches of the pooled value (global), or over
  // micro-batches and data-parallel ranks of each one's own (micro_batch).
  outcome.aux_loss = s.global_aux_loss ? aux_sum / static_cast<double>(s.accumulation)
                                       : sums[2].item<double>() / static_cast<double>(s.tp * s.accumulation * s.dp * s.cp);
  outcome.loss = outcome.lm_loss + aux_coef * outcome.aux_loss;
  if (s.max_grad_norm > 0) {
    const double coef = s.max_grad_norm / (outcome.grad_norm + 1e-6);
    if (coef < 1) {
      for (const auto& p : s.params) {
        if (p.grad().defined()) p.grad().mul_(coef);
      }
    }
  }
  auto& groups = s.optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const double scaled = g < s.group_lr.size() && s.base_lr > 0 ? s.group_lr[g] * (lr / s.base_lr) : lr;
    static_cast<torch::optim::AdamWOptions&>(groups[g].options()).lr(scaled);
  }
  s.optimizer.step();
  s.optimizer.zero_grad();
  return outcome;
}

}  // namespace hyperparallel::train
