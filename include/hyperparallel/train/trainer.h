// The SFT trainer: one rank's part of `hyperparallel train`.
//
// Every rank runs run_training with the world communicator. It builds the data (the same rows
// on every rank), the mesh from fsdp_config (1-D FSDP over all ranks, or 2-D HSDP with
// world / dp_shard_size replicas), the model (fully_shard on each decoder layer, then the
// root; a Hugging Face folder is built deferred and each rank reads only its rows), AdamW on the
// local shards and the LR schedule, then trains.
//
// One optimizer step takes the sampler's global batch of G = per_device_train_batch_size x
// gradient_accumulation_steps x dp rows. Its label tokens are counted up front from the data
// (every rank knows every row), each micro-batch's loss is its summed token loss / that count,
// and FSDP sums gradients (reduce op "sum") — so the step's loss and gradient are the
// 1-process ones for any layout: sum over all label tokens of the global batch / their count.
// Accumulation micro-batches run with gradient sync off except the last. The gradient norm is
// taken over all shards (sum of squares all-reduced) and clipped to max_grad_norm.
//
// With heldout_eval_samples > 0, held-out accuracy is measured before and after training
// (train/heldout_eval.h) and printed.
//
// Checkpoints (train/checkpoint.h) are written every save_steps steps and after the last;
// resume_from_checkpoint restores parameters, AdamW state, RNG and the sampler position, on
// the same layout or another with the same global batch. At the end the model is saved to
// output_dir as a Hugging Face folder (config.json, safetensors, tokenizer files).
//
// Rank 0 writes output_dir/trainer_log.jsonl (every logging_steps: the mean loss since the last
// line, grad_norm, lr, epoch, tokens_per_s, elapsed_s), train_summary.json, and prints one line
// per logged step (with a progress bar on a terminal); other ranks print only errors.
#pragma once

#include <iosfwd>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/train/train_config.h"

namespace hyperparallel::train {

struct TrainResult {
  std::vector<double> step_losses;  // each step this run took (from first_step), identical on every rank
  std::vector<double> grad_norms;
  int64_t steps = 0;       // the run's last step
  int64_t first_step = 0;  // steps done before this run (the checkpoint's, when resuming)
  std::optional<double> heldout_accuracy_before, heldout_accuracy_after;  // with heldout_eval_samples > 0
  std::vector<std::pair<int64_t, double>> eval_losses;  // (step, eval_loss) of each evaluation
};

// `log` gets rank 0's lines; with `progress_bar` (rank 0 on a terminal) a bar is redrawn
// below them every step.
TrainResult run_training(const TrainConfig& config, std::shared_ptr<comm::Communicator> world, std::ostream& log,
                         bool progress_bar = false);

}  // namespace hyperparallel::train
