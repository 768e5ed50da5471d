// Pipeline parallelism in the trainer (accelerator.pp_size > 1): the stage split and schedule
// from the config, and what a step needs around pp::PipelineStage.
//
// Each rank keeps only its stages (pp::keep_stages) before anything is loaded or sharded, so
// it loads, shards (FSDP over its stage's dp ranks), optimizes and checkpoints only those;
// every mesh axis but pp lies inside a stage. A step sends this rank's data-parallel share of
// the global batch through the pipeline as `microbatches` micro-batches of
// per_device_train_batch_size rows; FSDP reduces each stage's gradients once, at the stage's
// last backward.
//
// Two things cross stages besides activations:
//  - a tied embedding (the head is the embedding matrix): the first and the last stage each
//    hold a copy, equal at the start and kept equal by summing their gradients after backward
//    (a group of the two ranks); the gradient norm counts it once;
//  - MoE's load-balancing loss (moe_aux_loss_scope global): after a rank's last forward of a
//    micro-batch, its stages' routing sums go out in one asynchronous all-reduce over the
//    world (every stage, dp and cp rank: the pooled statistics of the micro-batch); each
//    stage's backward then adds its share, as train_step.h describes for one stage. Every rank
//    issues these all-reduces in micro-batch order, and waits for one only at a backward,
//    after every rank has forwarded that micro-batch, so they cannot deadlock.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <optional>
#include <vector>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/models/causal_lm.h"
#include "hyperparallel/pp/pipeline.h"
#include "hyperparallel/pp/schedule.h"
#include "hyperparallel/train/train_config.h"
#include "parallelize.h"

namespace hyperparallel::train {

struct PipelinePlan {
  std::vector<models::ModelSpan> split;
  pp::PipelineSchedule schedule;
};

// The micro-batches of a step under pp: accelerator.pp_microbatches, else
// gradient_accumulation_steps.
int64_t pipeline_microbatches(const TrainConfig& c);

// accelerator.pp_layers (or the balanced split) and pp_schedule over pp_size x
// pp_virtual_stages stages; UserError naming the numbers, and for combinations the runtime
// cannot do.
PipelinePlan plan_pipeline(const TrainConfig& c, const models::ModelConfig& config);

class PipelineTraining {
 public:
  // `model` already holds this rank's stages and is parallelized; `root` is its FSDP root.
  PipelineTraining(models::CausalLM& model, PipelinePlan plan, const ParallelLayout& layout, fsdp::FSDPModule root,
                   std::shared_ptr<comm::Communicator> world, const TrainConfig& c);
  ~PipelineTraining();

  struct Outcome {
    double lm_loss_sum = 0;  // this rank's (the last stage's ranks hold it)
    double aux_sum = 0;      // MoE: the pooled load-balancing loss summed over the micro-batches
  };
  // Forward and backward of the step's micro-batches (this rank's rows), then the tied
  // embedding's gradients summed. `aux_coef`: router_aux_loss_coef / micro-batches.
  Outcome run(const std::vector<models::CausalLMInput>& microbatches, double loss_scale, double aux_coef);
  // Forwards only: the loss sum and label tokens, on the last stage's ranks (0 elsewhere).
  std::pair<double, int64_t> evaluate(const std::vector<models::CausalLMInput>& microbatches);

  // Every parameter whole on world rank 0 (empty elsewhere), for export: each stage's gathered
  // inside the stage, then sent by its first rank to rank 0 over the pipeline group in one
  // buffer. Collective over the world.
  std::map<std::string, at::Tensor> gather_parameters();

  // The gradient-norm weights of model.parameters() with the tied copy counted once.
  std::vector<double> norm_weights(int64_t world_size) const;
  const PipelinePlan& plan() const { return plan_; }

 private:
  class RoutingPool;  // MoE statistics across stages
  models::CausalLM& model_;
  PipelinePlan plan_;
  fsdp::FSDPModule root_;
  std::shared_ptr<comm::Communicator> pp_group_;
  std::shared_ptr<comm::Communicator> tied_group_;  // the first and last stage's ranks, when tied
  std::unique_ptr<RoutingPool> routing_;
  std::unique_ptr<pp::PipelineStage> stage_;
  int64_t tp_ = 1;
  int64_t pp_ = 1;

  void sum_tied_gradients();
};

}  // namespace hyperparallel::train
