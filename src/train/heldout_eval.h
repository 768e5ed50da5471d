// Held-out accuracy: does the model answer prompts it never trained on?
//
// For the built-in synthetic datasets named in `dataset`, take `heldout_eval_samples` prompts
// from their held-out split (disjoint from training by construction), render each as a chat
// prompt with the generation opening (enable_thinking off, so qwen3's empty think block is in
// the prompt as in the trained turns), decode greedily with a KV cache and count exact
// matches of the trimmed answer. The prompts are split over all ranks and every rank runs the
// same number of forwards (FSDP's all-gathers are collective); the counts are summed.
#pragma once

#include <string>
#include <vector>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/data/tokenizer.h"
#include "hyperparallel/models/causal_lm.h"
#include "hyperparallel/train/train_config.h"

namespace hyperparallel::train {

struct HeldoutExample {
  std::string prompt, expected, answer;
};

struct HeldoutScore {
  int64_t correct = 0;
  int64_t total = 0;
  std::vector<HeldoutExample> answers;  // this rank's share, in order
  double accuracy() const { return total == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(total); }
};

// UserError when no dataset in config.dataset is a built-in synthetic one.
void check_heldout_config(const TrainConfig& config);

// Collective over `world`: every rank calls it with the same arguments. The prompts are split
// over `shares` data-parallel shares; this rank answers share `share` (ranks of one tensor-
// parallel group share one and run the same forwards).
HeldoutScore evaluate_heldout(models::CausalLM& model, const data::Tokenizer& tokenizer, const TrainConfig& config,
                              comm::Communicator& world, int64_t share, int64_t shares);

}  // namespace hyperparallel::train
