#include "support/hf_folder.h"

#include <filesystem>

#include "hyperparallel/data/tokenizer.h"
#include "hyperparallel/models/auto_model.h"

namespace hyperparallel::testing {

std::string write_tiny_hf_folder(const std::string& dir, int64_t seed) {
  return write_hf_folder(dir, models::debug_flavour_config("qwen3-debug"), seed);
}

std::string write_hf_folder(const std::string& dir, const models::ModelConfig& config, int64_t seed) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  models::ModelLoadOptions options;
  options.seed = static_cast<uint64_t>(seed);
  auto model = models::AutoModelForCausalLM::from_config(config, options);
  models::save_pretrained(*model, dir);
  data::copy_tokenizer_files(HP_SOURCE_DIR "/examples/tokenizer", dir);
  return dir;
}

}  // namespace hyperparallel::testing
