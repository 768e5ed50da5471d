// Batched decoding with a KV cache. See models/generation.h.
#include "hyperparallel/models/generation.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

#include "hyperparallel/models/causal_lm.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::models {
namespace {

at::Tensor next_tokens(const at::Tensor& last_logits, double temperature, at::Generator& rng) {
  if (temperature <= 0) return last_logits.argmax(-1);
  const at::Tensor probs = at::softmax(last_logits / temperature, -1);
  return at::multinomial(probs, 1, false, rng).view({-1});
}

}  // namespace

std::vector<std::vector<int64_t>> generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options) {
  if (options.max_new_tokens < 1) throw UserError("generate: max_new_tokens must be >= 1");
  const int64_t batch = static_cast<int64_t>(prompts.size());
  std::vector<std::vector<int64_t>> out(prompts.size());
  if (batch == 0) return out;
  size_t longest = 0;
  for (const auto& p : prompts) {
    if (p.empty()) throw UserError("generate: a prompt has no tokens");
    longest = std::max(longest, p.size());
  }
  // The model's context bounds the prompt and what may follow it (positions past
  // max_position_embeddings are outside what it was trained on; the cache would grow unbounded).
  const int64_t context = model.config().max_position_embeddings;
  if (static_cast<int64_t>(longest) >= context) {
    throw UserError("generate: the prompt has " + std::to_string(longest) + " tokens; the model's context is " +
                    std::to_string(context) + " (max_position_embeddings), so shorten the prompt");
  }
  if (options.max_new_tokens > context - static_cast<int64_t>(longest)) {
    throw UserError("generate: " + std::to_string(longest) + " prompt tokens + max_new_tokens " + std::to_string(options.max_new_tokens) +
                    " exceed the model's context of " + std::to_string(context) + " (max_position_embeddings); use at most " +
                    std::to_string(context - static_cast<int64_t>(longest)) + " new tokens");
  }
  at::NoGradGuard no_grad;
  at::Generator rng = at::make_generator<at::CPUGeneratorImpl>(options.seed);

  // Left padding: row b's prompt ends at the last column.
  const int64_t width = static_cast<int64_t>(longest);
  at::Tensor ids = at::full({batch, width}, options.pad_id, at::kLong);
  at::Tensor mask = at::zeros({batch, width}, at::kLong);
  for (int64_t b = 0; b < batch; ++b) {
    const auto& p = prompts[b];
    const int64_t pad = width - static_cast<int64_t>(p.size());
    ids[b].narrow(0, pad, static_cast<int64_t>(p.size())).copy_(at::tensor(p, at::kLong));
    mask[b].narrow(0, pad, static_cast<int64_t>(p.size())).fill_(1);
  }
  const auto positions_of = [](const at::Tensor& m) { return (m.cumsum(1) - 1).clamp_min(0); };

  KVCache cache;
  std::vector<bool> done(prompts.size(), false);
  at::Tensor step_ids = ids, all_ids = ids;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    CausalLMInput in;
    in.document_mask = false;
    in.output_router_logits = false;
    if (options.use_cache) {
      in.input_ids = step_ids;
      in.attention_mask = mask;
      in.position_ids = positions_of(mask).narrow(1, mask.size(1) - step_ids.size(1), step_ids.size(1));
      in.cache = &cache;
    } else {
      in.input_ids = all_ids;
      in.attention_mask = mask;
      in.position_ids = positions_of(mask);
    }
    const at::Tensor logits = model.forward(in).logits;
    const at::Tensor token = next_tokens(logits.select(1, logits.size(1) - 1), options.temperature, rng);
    const auto* t = token.data_ptr<int64_t>();
    bool all_done = true;
    for (int64_t b = 0; b < batch; ++b) {
      if (!done[b]) {
        if (std::find(options.stop_ids.begin(), options.stop_ids.end(), t[b]) != options.stop_ids.end()) {
          done[b] = true;
        } else {
          out[b].push_back(t[b]);
        }
      }
      all_done = all_done && done[b];
    }
    if (all_done && !options.run_all_steps) break;
    step_ids = token.view({batch, 1});
    all_ids = at::cat({all_ids, step_ids}, 1);
    mask = at::cat({mask, at::ones({batch, 1}, at::kLong)}, 1);
  }
  return out;
}

}  // namespace hyperparallel::models
