// The evaluation loss. See eval_loss.h.
#include "eval_loss.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "pipeline_training.h"
#include "train_step.h"

namespace hyperparallel::train {

double evaluate_loss(models::CausalLM& model, const data::TokenRows& rows, int64_t pad_id, const EvalShare& share,
                     comm::Communicator& world, std::vector<fsdp::FSDPModule>& units, PipelineTraining* pipeline) {
  at::NoGradGuard no_grad;
  const int64_t n = rows.size();
  const int64_t per_pass = share.dp * share.rows_per_micro_batch;
  const int64_t passes = (n + per_pass - 1) / per_pass;
  data::TrainingRow silent = rows.empty() ? data::TrainingRow{} : rows.row(0);
  std::fill(silent.labels.begin(), silent.labels.end(), data::kIgnoreLabel);
  double loss_sum = 0, tokens = 0;
  std::vector<models::CausalLMInput> staged;  // under pipeline parallelism: all passes, then through the stages
  for (int64_t p = 0; p < passes; ++p) {
    std::vector<int64_t> mine;
    for (int64_t k = 0; k < share.rows_per_micro_batch; ++k) {
      const int64_t r = p * per_pass + share.dp_rank * share.rows_per_micro_batch + k;
      if (r < n) mine.push_back(r);
    }
    const data::TokenBatch batch = mine.empty() ? data::collate_rows({&silent}, pad_id) : data::collate_rows(rows, mine, pad_id);
    const models::CausalLMInput in = model_input(batch, share.cp, share.cp_rank);
    if (pipeline) {
      staged.push_back(in);
      continue;
    }
    const models::CausalLMOutput out = model.forward(in);
    loss_sum += out.lm_loss_sum.item<double>();
    tokens += static_cast<double>(out.label_tokens);  // this rank's share of the rows' label tokens
  }
  if (pipeline) {
    const auto [sum, label_tokens] = pipeline->evaluate(staged);  // on the last stage's ranks
    loss_sum = sum;
    tokens = static_cast<double>(label_tokens);
  }
  for (auto& unit : units) unit.reshard();
  at::Tensor sums = at::tensor({loss_sum, tokens}, at::kDouble);
  world.all_reduce(sums).wait();
  // tp ranks of a group count the same rows (in the sum and the count alike).
  return sums[0].item<double>() / std::max(1.0, sums[1].item<double>());
}

}  // namespace hyperparallel::train
