// Spelling suggestions. See platform/suggest.h.
#include "hyperparallel/platform/suggest.h"

#include <algorithm>

namespace hyperparallel {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  // Edit distance is quadratic: a word far longer than any name has no close one anyway.
  if (word.size() > kMaxSuggestedWord) return "";
  const size_t limit = std::max<size_t>(2, word.size() / 3);
  const std::string* best = nullptr;
  size_t best_distance = limit + 1;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = &c;
    }
  }
  return best ? " (did you mean '" + *best + "'?)" : "";
}

std::string excerpt(const std::string& text, size_t max_chars, bool quoted) {
  const std::string q = quoted ? "'" : "";
  if (text.size() <= max_chars) return q + text + q;
  return q + text.substr(0, max_chars) + "..." + q + " (" + std::to_string(text.size()) + " bytes)";
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace hyperparallel
