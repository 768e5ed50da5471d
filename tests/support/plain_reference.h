// The trainer's reference: the same job as `hyperparallel train` on a plain, unsharded model
// in this process — the trainer's data rows, sampler order, loss (label-token sum over the
// global batch's label tokens), AdamW groups (no decay on norms and biases), learning-rate
// schedule and clipping, written out with LibTorch alone: no fully_shard, no mesh, no
// communicator, one forward per global batch. Parity tests compare every layout with it.
#pragma once

#include <utility>
#include <vector>

#include "hyperparallel/train/train_config.h"

namespace hyperparallel::testing {

struct PlainRun {
  std::vector<double> losses;      // per optimizer step (MoE: lm + router_aux_loss_coef x aux, as HF)
  std::vector<double> aux_losses;  // MoE: the load-balancing loss of each step's global batch
  std::vector<double> grad_norms;  // before clipping
  // (step, eval loss) where the config evaluates (eval_on_start, every eval_steps with
  // eval_strategy steps, after the last step with do_eval): all eval rows in one forward, the
  // label-token sum over their label tokens.
  std::vector<std::pair<int64_t, double>> eval_losses;
};

// `config` as the trainer reads it; its global batch is per_device_train_batch_size x
// gradient_accumulation_steps rows (one process).
PlainRun plain_reference_run(const train::TrainConfig& config);

}  // namespace hyperparallel::testing
