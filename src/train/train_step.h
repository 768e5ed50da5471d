// One optimizer step of the SFT trainer: the global batch's micro-batches through forward and
// backward on this rank's share, the global gradient norm (one all-reduce, which also sums the
// loss), clipping, and AdamW.
//
// The loss of every micro-batch is divided by the label tokens of the whole global batch, and
// FSDP sums (not averages) the gradients, so the step equals one step of a single process on
// the global batch whatever the layout and accumulation. Gradient sync runs on the last
// micro-batch only. The gradient norm is fsdp::clip_grad_norm_'s (each piece's squared norm
// weighted by 1 / the ranks holding it), all-reduced together with the loss in one collective.
//
// MoE's load-balancing loss, moe_aux_loss_scope global (the default): after each micro-batch's
// forward the routing sums (models/moe.h) are all-reduced over the ranks, and each rank
// backpropagates E / N^2 x sum_e C_e x P_e(own tokens), with C and N the pooled counts: the
// ranks' gradients add up to the gradient of the loss over the pooled tokens, so a step is
// one process's step on the same micro-batches whatever the data-parallel split. Over
// gradient accumulation the micro-batches' losses are averaged (the statistics of a later
// micro-batch are not known when an earlier one runs backward), so runs agree at the same
// accumulation count. micro_batch: each rank's own HF loss per micro-batch, averaged.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/models/causal_lm.h"
#include "models/moe.h"
#include "train_data.h"

namespace torch::optim {
class AdamW;
}
namespace hyperparallel::models {
class CausalLM;
}
namespace hyperparallel::fsdp {
class FSDPModule;
}

namespace hyperparallel::train {

class PipelineTraining;  // pipeline_training.h

// What every step of a run uses; fixed for the run.
struct StepSetup {
  models::CausalLM& model;
  fsdp::FSDPModule& root;
  torch::optim::AdamW& optimizer;
  comm::Communicator& world;
  const TrainData& data;
  std::vector<at::Tensor> params;
  std::vector<double> norm_weights;  // fsdp::gradient_norm_weights of the model
  int64_t accumulation = 1;
  int64_t dp = 1, dp_rank = 0, tp = 1;
  double max_grad_norm = 0;  // 0 = no clipping
  // MoE: the load-balancing loss over the whole global batch's tokens (true: moe_aux_loss_scope
  // global) or, as HF's per-forward number, per micro-batch and rank, averaged (false).
  bool global_aux_loss = true;
  int64_t cp = 1, cp_rank = 0;  // context parallelism: each micro-batch's rows split over cp ranks
  // The schedule gives learning_rate's value at each step (`lr`); each param group runs at its
  // own initial lr scaled alike (Muon's group has its own).
  double base_lr = 0;
  std::vector<double> group_lr = {};
  // Pipeline parallelism: the micro-batches (accumulation of them) go through this rank's
  // stages by the schedule instead of one after another through the whole model.
  PipelineTraining* pipeline = nullptr;
};

struct StepOutcome {
  double loss = 0;       // lm_loss + router_aux_loss_coef x aux_loss (= lm_loss for dense models), as HF reports it
  double lm_loss = 0;    // mean over the global batch's label tokens
  double aux_loss = 0;   // MoE load-balancing loss (0 for dense models)
  double dropped_fraction = 0;  // MoE with a capacity: routed pairs dropped, over all ranks
  double grad_norm = 0;  // before clipping
  int64_t input_tokens = 0;  // of the global batch
};

// A collated batch as the model's input (ids, labels, mask, positions); with cp > 1 this cp
// rank's share of its rows (cp::shard_sequence).
models::CausalLMInput model_input(const data::TokenBatch& batch, int64_t cp = 1, int64_t cp_rank = 0);

// The global-scope load-balancing term of one micro-batch (see above): its value over the
// pooled tokens, and the part this rank backpropagates. `pooled` is routing_vector summed over
// the ranks; own_prob_sums this rank's (with gradient).
struct PooledAux {
  double value = 0;
  at::Tensor own_part;
};
at::Tensor routing_vector(const models::RoutingSums& own);  // counts, prob_sums, tokens (fp64, detached)
PooledAux pooled_aux(at::Tensor pooled, const at::Tensor& own_prob_sums, int64_t experts, int64_t tp);

// One step on `global_rows` (the sampler's global batch) at learning rate `lr`.
StepOutcome run_optimizer_step(const StepSetup& setup, const std::vector<int64_t>& global_rows, double lr);

}  // namespace hyperparallel::train
