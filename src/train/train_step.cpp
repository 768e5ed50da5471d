// One optimizer step. See train_step.h.
#include "train_step.h"

#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>

#include "hyperparallel/data/batch_sampler.h"
#include "hyperparallel/fsdp/clip_grad_norm.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/models/causal_lm.h"

namespace hyperparallel::train {
namespace {

at::Tensor as_tensor(const std::vector<int64_t>& v, int64_t rows, int64_t length) {
  return at::tensor(v, at::kLong).view({rows, length});
}

}  // namespace

models::CausalLMInput model_input(const data::TokenBatch& batch) {
  models::CausalLMInput in;
  in.input_ids = as_tensor(batch.input_ids, batch.rows, batch.length);
  in.labels = as_tensor(batch.labels, batch.rows, batch.length);
  in.attention_mask = as_tensor(batch.attention_mask, batch.rows, batch.length);
  in.position_ids = as_tensor(batch.position_ids, batch.rows, batch.length);
  return in;
}

StepOutcome run_optimizer_step(const StepSetup& s, const std::vector<int64_t>& global, double lr) {
  const TrainData& data = s.data;
  StepOutcome outcome;
  int64_t label_tokens = 0;
  for (int64_t r : global) {
    label_tokens += data.label_tokens[r];
    outcome.input_tokens += static_cast<int64_t>(data.rows[r].input_ids.size());
  }
  const double denominator = static_cast<double>(std::max<int64_t>(1, label_tokens));
  double local_loss_sum = 0;
  for (int64_t m = 0; m < s.accumulation; ++m) {
    std::vector<const data::TrainingRow*> mine;
    for (int64_t r : data::GlobalBatchSampler::rank_micro_batch(global, s.dp_rank, s.dp, m, s.accumulation)) mine.push_back(&data.rows[r]);
    const models::CausalLMInput in = model_input(data::collate_rows(mine, data.pad_id));
    s.root.set_requires_gradient_sync(m == s.accumulation - 1);
    const models::CausalLMOutput out = s.model.forward(in);
    at::Tensor loss = out.lm_loss_sum / denominator;
    // MoE: the load-balancing term (per micro-batch, averaged over micro-batches and ranks).
    if (out.aux_loss.defined()) loss = loss + (out.loss - out.lm_loss) / static_cast<double>(s.accumulation * s.dp);
    loss.backward();
    local_loss_sum += out.lm_loss_sum.item<double>();
  }
  // The squared gradient norm and the loss in one all-reduce.
  at::Tensor sums = at::stack({fsdp::local_squared_gradient_norm(s.model, s.norm_weights), at::scalar_tensor(local_loss_sum, at::kDouble)});
  s.world.all_reduce(sums).wait();
  outcome.grad_norm = std::sqrt(sums[0].item<double>());
  outcome.loss = sums[1].item<double>() / static_cast<double>(s.tp) / denominator;  // tp ranks share each micro-batch
  if (s.max_grad_norm > 0) {
    const double coef = s.max_grad_norm / (outcome.grad_norm + 1e-6);
    if (coef < 1) {
      for (const auto& p : s.params) {
        if (p.grad().defined()) p.grad().mul_(coef);
      }
    }
  }
  for (auto& group : s.optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  s.optimizer.step();
  s.optimizer.zero_grad();
  return outcome;
}

}  // namespace hyperparallel::train
