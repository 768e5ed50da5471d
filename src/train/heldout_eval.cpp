// Held-out accuracy by greedy generation. See heldout_eval.h.
#include "heldout_eval.h"

#include <algorithm>
#include <sstream>

#include "hyperparallel/data/chat_template.h"
#include "train_data.h"
#include "hyperparallel/data/synthetic_sft.h"
#include "hyperparallel/models/generation.h"
#include "hyperparallel/platform/suggest.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::train {
namespace {

std::vector<std::string> synthetic_names(const std::string& datasets) {
  std::vector<std::string> out;
  std::stringstream in(datasets);
  std::string name;
  while (std::getline(in, name, ',')) {
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    if (data::is_synthetic_dataset(name)) out.push_back(name);
  }
  return out;
}

std::string trimmed(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r\n") - begin + 1);
}

}  // namespace

void check_heldout_config(const TrainConfig& c) {
  if (c.heldout_eval_samples > 0 && synthetic_names(c.dataset).empty()) {
    throw UserError("heldout_eval_samples: needs a built-in synthetic dataset (" + join_names(data::synthetic_dataset_names()) +
                    ") in dataset, which has '" + c.dataset + "'; set heldout_eval_samples: 0");
  }
}

HeldoutScore evaluate_heldout(models::CausalLM& model, const data::Tokenizer& tokenizer, const TrainConfig& c,
                              comm::Communicator& world, int64_t share, int64_t shares) {
  check_heldout_config(c);
  const std::vector<std::string> names = synthetic_names(c.dataset);
  const int64_t n = c.heldout_eval_samples;
  const int64_t per_dataset = (n + static_cast<int64_t>(names.size()) - 1) / static_cast<int64_t>(names.size());
  std::vector<data::Conversation> heldout;
  for (const auto& name : names) {
    for (auto& conv : data::make_synthetic_dataset(name, 0, per_dataset, 0).heldout) heldout.push_back(std::move(conv));
  }
  heldout.resize(static_cast<size_t>(n));

  const auto chat_template = chat_template_for(c, tokenizer);
  data::ChatRenderOptions render;
  render.add_generation_prompt = true;
  render.enable_thinking = false;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::string> expected;
  size_t longest_answer = 0;
  for (const auto& conv : heldout) {
    std::vector<data::ChatMessage> messages(conv.messages.begin(), conv.messages.end() - 1);
    prompts.push_back(tokenizer.encode(chat_template.render(messages, render)));
    expected.push_back(trimmed(conv.messages.back().content));
    longest_answer = std::max(longest_answer, tokenizer.encode(expected.back()).size());
  }

  // Share s answers prompts [s * chunk, (s + 1) * chunk); a share with none still decodes
  // (one stand-in prompt) so every rank runs the same forwards.
  const int64_t chunk = (n + shares - 1) / shares;
  const int64_t begin = std::min(n, share * chunk), end = std::min(n, begin + chunk);
  std::vector<std::vector<int64_t>> mine(prompts.begin() + begin, prompts.begin() + end);
  if (mine.empty()) mine.push_back(prompts.front());

  models::GenerationOptions options;
  options.max_new_tokens = static_cast<int64_t>(longest_answer) + 4;  // room to show a wrong, longer answer
  options.stop_ids = tokenizer.end_of_turn_ids();
  options.run_all_steps = true;
  const auto answers = models::generate(model, mine, options);

  HeldoutScore score;
  int64_t correct = 0;
  for (int64_t i = begin; i < end; ++i) {
    const std::string answer = trimmed(tokenizer.decode(answers[i - begin], true));
    if (answer == expected[i]) ++correct;
    score.answers.push_back({heldout[i].messages[heldout[i].messages.size() - 2].content, expected[i], answer});
  }
  at::Tensor count = at::full({1}, correct, at::kLong);
  world.all_reduce(count).wait();
  score.correct = count.item<int64_t>() / (world.size() / shares);  // each share counted by all its ranks
  score.total = n;
  return score;
}

}  // namespace hyperparallel::train
