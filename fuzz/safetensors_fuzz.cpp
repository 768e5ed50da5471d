// libFuzzer target: any bytes as a .safetensors file. The reader must either accept the file
// (and then every tensor it lists reads within the mapping) or throw UserError; any other
// exception, crash, or out-of-bounds access (ASan) is a finding.
#include <ATen/core/Tensor.h>

#include "fuzz_input_file.h"
#include "hyperparallel/io/safetensors.h"
#include "hyperparallel/platform/user_error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hyperparallel::fuzz::write_input(data, size, ".safetensors");
  try {
    hyperparallel::io::SafetensorsFile file(path);
    for (const auto& e : file.entries()) {
      const at::Tensor t = file.read(e.name);
      if (t.dim() > 0 && t.size(0) > 0) file.read_rows(e.name, 0, 0, 1);
    }
  } catch (const hyperparallel::UserError&) {
  }
  return 0;
}
