// Built-in synthetic chat tasks. See data/synthetic_sft.h.
#include "hyperparallel/data/synthetic_sft.h"

#include <algorithm>
#include <array>
#include <functional>

#include "hyperparallel/platform/suggest.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::data {
namespace {

struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int64_t uniform(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1)); }
};

// FNV-1a: stable across platforms, unlike std::hash.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

bool is_heldout_prompt(const std::string& prompt) { return fnv1a(prompt) % 16 == 0; }

struct Example {
  std::string prompt, answer;
};

Example reverse_example(Rng& rng) {
  static const std::array<const char*, 24> kWords = {"sun",  "moon", "tree",  "river", "stone", "cloud", "bird",  "fish",
                                                     "fire", "rain", "wind",  "snow",  "apple", "bread", "green", "blue",
                                                     "red",  "cat",  "dog",   "horse", "road",  "house", "light", "sea"};
  const int64_t n = rng.uniform(3, 6);
  std::vector<std::string> words;
  for (int64_t i = 0; i < n; ++i) words.push_back(kWords[rng.uniform(0, kWords.size() - 1)]);
  std::string prompt = "Reverse the words:", answer;
  for (const auto& w : words) prompt += " " + w;
  for (auto it = words.rbegin(); it != words.rend(); ++it) answer += (answer.empty() ? "" : " ") + *it;
  return {prompt, answer};
}

Example addition_example(Rng& rng) {
  const auto operand = [&] {
    const int64_t digits = rng.uniform(1, 3);
    int64_t hi = 1;
    for (int64_t i = 0; i < digits; ++i) hi *= 10;
    return rng.uniform(digits == 1 ? 0 : hi / 10, hi - 1);
  };
  const int64_t a = operand(), b = operand();
  return {"What is " + std::to_string(a) + " + " + std::to_string(b) + "?", std::to_string(a + b)};
}

Conversation conversation(const Example& e, const std::string& name, const char* split, size_t index) {
  Conversation c;
  c.messages = {{"user", e.prompt}, {"assistant", e.answer}};
  c.source = name + "/" + split + "#" + std::to_string(index);
  return c;
}

}  // namespace

std::vector<std::string> synthetic_dataset_names() { return {"synthetic_addition", "synthetic_reverse"}; }

bool is_synthetic_dataset(const std::string& name) {
  const auto names = synthetic_dataset_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

SyntheticSplits make_synthetic_dataset(const std::string& name, int64_t train_count, int64_t heldout_count, uint64_t seed) {
  std::function<Example(Rng&)> generate;
  if (name == "synthetic_reverse") {
    generate = reverse_example;
  } else if (name == "synthetic_addition") {
    generate = addition_example;
  } else {
    throw UserError("'" + name + "' is not a built-in synthetic dataset" + did_you_mean(name, synthetic_dataset_names()) +
                    "; built in: " + join_names(synthetic_dataset_names()));
  }
  SyntheticSplits splits;
  // One stream per split, so each split is a prefix of what a larger count would give.
  Rng train_rng{seed * 2 + 1}, heldout_rng{seed * 2 + 2};
  while (static_cast<int64_t>(splits.train.size()) < train_count) {
    const Example e = generate(train_rng);
    if (!is_heldout_prompt(e.prompt)) splits.train.push_back(conversation(e, name, "train", splits.train.size()));
  }
  while (static_cast<int64_t>(splits.heldout.size()) < heldout_count) {
    const Example e = generate(heldout_rng);
    if (is_heldout_prompt(e.prompt)) splits.heldout.push_back(conversation(e, name, "heldout", splits.heldout.size()));
  }
  return splits;
}

}  // namespace hyperparallel::data
