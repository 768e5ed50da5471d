// The evaluation loss (LlamaFactory's / HF's eval_loss) of held-out rows: `eval_dataset`, or
// the `val_size` split of the training data, every `eval_steps` and after training.
//
// It is the mean token cross-entropy over all the eval rows' label tokens — the same
// per-token loss training reports, and the same number on every layout. (HF's Trainer instead
// averages each batch's mean loss, weighted by rows, so its eval_loss moves with the eval
// batch size; with rows of equal label counts the two agree.) The rows are dealt to the
// data-parallel ranks in micro-batches of `per_device_eval_batch_size`; every rank runs the
// same number of forwards (FSDP's all-gathers are collective), a rank with no rows left
// running one row whose labels are all ignored; tensor-parallel ranks of one group take the
// same rows (under pipeline parallelism the last stage's ranks count). One all-reduce sums the losses and token counts. No gradients are kept, and
// every unit is resharded afterwards (a forward without backward leaves them gathered).
#pragma once

#include <cstdint>
#include <vector>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/data/token_rows.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/models/causal_lm.h"

namespace hyperparallel::train {

struct EvalShare {
  int64_t rows_per_micro_batch = 1;  // per_device_eval_batch_size
  int64_t dp = 1, dp_rank = 0, tp = 1;
  int64_t cp = 1, cp_rank = 0;  // cp ranks take their share of each row's sequence
};

class PipelineTraining;  // pipeline_training.h

// Collective over `world`; every rank passes the same rows. With `pipeline` the passes go
// through the pipeline's stages (forwards only).
double evaluate_loss(models::CausalLM& model, const data::TokenRows& rows, int64_t pad_id, const EvalShare& share,
                     comm::Communicator& world, std::vector<fsdp::FSDPModule>& units, PipelineTraining* pipeline = nullptr);

}  // namespace hyperparallel::train
