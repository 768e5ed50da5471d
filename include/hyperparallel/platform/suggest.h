// Spelling suggestions for error messages: the closest known name to a mistyped one, by edit
// distance, so "unknown key 'learning_rat'" can add "did you mean 'learning_rate'?".
#pragma once

#include <string>
#include <vector>

namespace hyperparallel {

// Levenshtein distance (insertions, deletions, substitutions), bytes.
size_t edit_distance(const std::string& a, const std::string& b);

// " (did you mean 'x'?)" for the closest candidate within a third of the word's length (at
// least 2 edits), else "" (also for a word over kMaxSuggestedWord bytes).
inline constexpr size_t kMaxSuggestedWord = 256;
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

// A user's text quoted for a message, cut to `max_chars` with its length: 'abc...' (104857600
// bytes); unquoted for a JSON value's own text.
std::string excerpt(const std::string& text, size_t max_chars = 120, bool quoted = true);

// "a, b, c"
std::string join_names(const std::vector<std::string>& names);

}  // namespace hyperparallel
