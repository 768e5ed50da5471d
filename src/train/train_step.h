// One optimizer step of the SFT trainer: the global batch's micro-batches through forward and
// backward on this rank's share, the global gradient norm (one all-reduce, which also sums the
// loss), clipping, and AdamW.
//
// The loss of every micro-batch is divided by the label tokens of the whole global batch, and
// FSDP sums (not averages) the gradients, so the step equals one step of a single process on
// the global batch whatever the layout and accumulation. Gradient sync runs on the last
// micro-batch only. The gradient norm is fsdp::clip_grad_norm_'s (each piece's squared norm
// weighted by 1 / the ranks holding it), all-reduced together with the loss in one collective.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/models/causal_lm.h"
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
};

struct StepOutcome {
  double loss = 0;       // mean over the global batch's label tokens
  double grad_norm = 0;  // before clipping
  int64_t input_tokens = 0;  // of the global batch
};

// A collated batch as the model's input (ids, labels, mask, positions).
models::CausalLMInput model_input(const data::TokenBatch& batch);

// One step on `global_rows` (the sampler's global batch) at learning rate `lr`.
StepOutcome run_optimizer_step(const StepSetup& setup, const std::vector<int64_t>& global_rows, double lr);

}  // namespace hyperparallel::train
