// Spelling suggestions for error messages: the closest known name to a mistyped one, by edit
// distance, so "unknown key 'learning_rat'" can add "did you mean 'learning_rate'?".
#pragma once

#include <string>
#include <vector>

namespace hyperparallel {

// Levenshtein distance (insertions, deletions, substitutions), bytes.
size_t edit_distance(const std::string& a, const std::string& b);

// " (did you mean 'x'?)" for the closest candidate within a third of the word's length (at
// least 2 edits), else "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

// "a, b, c"
std::string join_names(const std::vector<std::string>& names);

}  // namespace hyperparallel
