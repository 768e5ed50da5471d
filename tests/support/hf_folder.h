// A small Hugging Face model folder for tests of the command-line tool: the built-in
// qwen3-debug architecture (or a given config) saved as save_pretrained writes it, with the
// project's tokenizer.
#pragma once

#include <string>

#include "hyperparallel/models/model_config.h"

namespace hyperparallel::testing {

// Replaces `dir` with the folder; returns `dir`.
std::string write_tiny_hf_folder(const std::string& dir, int64_t seed = 9);
// The same for a model of `config` (initialised from `seed`).
std::string write_hf_folder(const std::string& dir, const models::ModelConfig& config, int64_t seed = 9);

}  // namespace hyperparallel::testing
