// Small helpers the tests share: writing and reading whole files, catching a UserError's text,
// and the labelled (trained) text of a row.
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "hyperparallel/data/sft_samples.h"
#include "hyperparallel/data/tokenizer.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::testing {

// Writes `text` to `path` (parent folders created); returns `path`.
inline std::string write_text_file(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  return path;
}

inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The message of the UserError `f` throws, or "no error".
inline std::string user_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

// The decoded runs of consecutive labelled tokens of `row`: the text it trains on. Each label
// must be the row's own token there (the loss shifts, the labels do not).
inline std::vector<std::string> labelled_runs(const data::Tokenizer& tokenizer, const data::TrainingRow& row) {
  std::vector<std::string> runs;
  std::vector<int64_t> run;
  for (size_t i = 0; i <= row.labels.size(); ++i) {
    if (i < row.labels.size() && row.labels[i] != data::kIgnoreLabel) {
      if (row.labels[i] != row.input_ids[i]) return {"<label " + std::to_string(i) + " is not the token there>"};
      run.push_back(row.labels[i]);
    } else if (!run.empty()) {
      runs.push_back(tokenizer.decode(run));
      run.clear();
    }
  }
  return runs;
}

}  // namespace hyperparallel::testing
