// Text generation from a CausalLM: greedy or sampled decoding of a batch of prompts with a
// KV cache.
//
// Prompts of different lengths are left-padded into one batch; the padding is masked out of
// attention and positions count real tokens only, so each row's continuation is what it
// would be alone. The first forward runs the whole prompt and fills the cache; every later
// one feeds one token per row. A row stops at its first stop id (not included in the
// output) or after max_new_tokens.
//
// Under FSDP every rank must run the same number of forwards: `run_all_steps` keeps
// decoding until max_new_tokens even when every row has stopped. `use_cache = false`
// recomputes the whole sequence per token (the reference the cached path is tested against).
#pragma once

#include <cstdint>
#include <vector>

namespace hyperparallel::models {

class CausalLM;

struct GenerationOptions {
  int64_t max_new_tokens = 64;
  double temperature = 0;  // 0 = greedy (argmax); > 0 samples from softmax(logits / temperature)
  uint64_t seed = 0;       // for sampling
  std::vector<int64_t> stop_ids;
  int64_t pad_id = 0;
  bool run_all_steps = false;
  bool use_cache = true;
};

// One continuation per prompt (token ids after the prompt, stop id excluded). Runs without
// autograd. UserError for an empty prompt or a non-positive max_new_tokens.
std::vector<std::vector<int64_t>> generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options);

}  // namespace hyperparallel::models
