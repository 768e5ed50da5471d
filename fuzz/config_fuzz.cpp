// libFuzzer target: any bytes as a training YAML file. The loader returns a config or throws
// UserError naming the problem; yaml-cpp's own exceptions must never escape.
#include "fuzz_input_file.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/train/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hyperparallel::fuzz::write_input(data, size, ".yaml");
  try {
    hyperparallel::train::load_train_config(path, {});
  } catch (const hyperparallel::UserError&) {
  }
  return 0;
}
