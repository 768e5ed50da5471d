// Built-in synthetic SFT datasets: deterministic chat tasks a tiny model learns on a CPU in
// minutes, with a held-out split whose prompts never occur in training. Used by the demo,
// tests and benchmarks, with no files.
//
//   synthetic_reverse   "Reverse the words: sun tree river" -> "river tree sun"
//                       (3 to 6 words from a fixed list of 24)
//   synthetic_addition  "What is 482 + 37?" -> "519" (operands of 1 to 3 digits)
//
// A prompt belongs to the held-out split when a hash of its text says so (1 in 16), so the two
// splits are disjoint by construction. Generation is a SplitMix64 stream from the seed: the
// same (name, count, seed) gives the same conversations everywhere.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hyperparallel/data/sft_dataset.h"

namespace hyperparallel::data {

struct SyntheticSplits {
  std::vector<Conversation> train;    // user + assistant
  std::vector<Conversation> heldout;  // user + assistant (the expected answer)
};

std::vector<std::string> synthetic_dataset_names();
bool is_synthetic_dataset(const std::string& name);

// UserError for an unknown name.
SyntheticSplits make_synthetic_dataset(const std::string& name, int64_t train_count = 4000, int64_t heldout_count = 200,
                                       uint64_t seed = 0);

}  // namespace hyperparallel::data
