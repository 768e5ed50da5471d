// PipelineStage: runs one rank's action list of a pipeline schedule (pp/schedule.h) on the
// stages of a model it holds (pp/stage_split.h), moving activations forward and gradients
// backward between the ranks by send/recv over the pipeline group.
//
// Every rank of the group is given the same micro-batches (ids, positions, mask, labels: the
// data loader runs everywhere, which is cheaper than sending them); the first stage embeds the
// ids, the others start from the hidden states they receive, the last computes the loss sum
// times `loss_scale` (the caller's normalisation, e.g. 1 / the global batch's label tokens)
// and starts backward from it. Shapes are not exchanged: every rank computes a transfer's
// shape from the micro-batch it has (`boundary_shape`, default [rows, tokens, hidden]) and a
// sender checks it. Transfers are asynchronous: a send is waited only at the end of the step,
// and the receive an action needs is posted one action ahead, so it runs during the current
// one. A rank whose peer fails gets the communicator's error with the stage and action named.
//
// Backward. B runs autograd from the stage's output with the received gradient. The split
// schedule (zero_bubble) runs each forward with separate segments (CausalLM::forward_span):
// I walks the segments from the last to the first, each one's input gradient from its output
// gradient (retaining the graph), and sends the first one's; while it runs, each parameter's
// junction (pp/weight_pass.h: a linear layer's MmBackward) keeps the gradient that reached it.
// W then runs only the junctions' parameter side from those gradients (dW = dYᵀX), the
// gradient hooks it skips (segment outputs, nodes inside above the junctions) called first,
// all inside one autograd task, so FSDP sees one backward.
//
// Data parallelism inside a stage (FSDP on a (pp, dp) mesh) stays the caller's: before each
// backward that produces weight gradients (B or W) `before_weight_backward(stage, last)` is
// called, `last` true for that stage's last one in the step, so a caller turns gradient
// reduction on only then (one reduction per step). The input-gradient pass I runs with it off.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/models/causal_lm.h"
#include "hyperparallel/pp/schedule.h"

namespace hyperparallel::pp {

struct PipelineHooks {
  // Called before each B or W of `stage`; `last`: the stage's last one of the step.
  std::function<void(int64_t stage, bool last)> before_weight_backward;
  // Called before each backward of the split schedule's input-gradient pass (I).
  std::function<void(int64_t stage)> before_input_backward;
  // The hidden states' shape between stages for a micro-batch (e.g. the sequence divided by the
  // tensor-parallel degree under sequence parallelism); null: [rows, tokens, hidden].
  std::function<std::vector<int64_t>(const models::CausalLMInput&)> boundary_shape;
  // The hidden states' dtype between stages; unset: the model's first parameter's.
  std::optional<at::ScalarType> boundary_dtype;
  // After F(microbatch, stage), with the span's output (e.g. to pool MoE routing statistics).
  std::function<void(int64_t microbatch, int64_t stage, const models::SpanOutput& out)> after_forward;
  // At B or I of (microbatch, stage): an extra term the stage backpropagates besides its
  // output (e.g. its share of MoE's load-balancing loss from the span's router logits), or an
  // undefined tensor.
  std::function<at::Tensor(int64_t microbatch, int64_t stage, const models::SpanOutput& out)> extra_loss;
};

struct PipelineStepResult {
  double lm_loss_sum = 0;    // over the micro-batches, on the rank of the last stage (0 elsewhere)
  int64_t label_tokens = 0;  // idem
  double busy_seconds = 0;   // in forward and backward compute
  double step_seconds = 0;   // the whole action list, transfers and waits included
  int64_t peak_in_flight = 0;  // the most (micro-batch, stage) forwards held for their backward at once
  // zero_bubble's W, summed over its actions: parameter groups whose gradients started at the
  // junctions I captured, and groups replayed from their segment's outputs (pp/weight_pass.h).
  int64_t weight_groups_direct = 0;
  int64_t weight_groups_replayed = 0;
};

class PipelineStage {
 public:
  // `model` holds this rank's stages (keep_stages); `split` lists every stage; `group` is the
  // pipeline group (its rank r runs schedule.per_rank[r]).
  PipelineStage(models::CausalLM& model, std::vector<models::ModelSpan> split, PipelineSchedule schedule,
                std::shared_ptr<comm::Communicator> group, PipelineHooks hooks = {});
  ~PipelineStage();

  // One step: every micro-batch through this rank's actions. UserError when the count is not
  // the schedule's.
  PipelineStepResult run(const std::vector<models::CausalLMInput>& microbatches, double loss_scale);
  // Forwards only, without gradients (evaluation): any number of micro-batches, each through
  // every stage in turn; the loss sums land on the last stage's rank.
  PipelineStepResult evaluate(const std::vector<models::CausalLMInput>& microbatches);

  const PipelineSchedule& schedule() const { return schedule_; }
  const std::vector<models::ModelSpan>& split() const { return split_; }

 private:
  class Step;  // one run's state, src/pp/pipeline.cpp
  models::CausalLM& model_;
  std::vector<models::ModelSpan> split_;
  PipelineSchedule schedule_;
  std::shared_ptr<comm::Communicator> group_;
  PipelineHooks hooks_;
};

}  // namespace hyperparallel::pp
