// libFuzzer target: any bytes as tokenizer.json, then encode and decode texts with it. Loading
// either succeeds or throws UserError; a loaded tokenizer encodes any text (valid UTF-8 or
// not) to ids inside its vocabulary without crashing.
#include <cstring>

#include "fuzz_input_file.h"
#include "hyperparallel/data/tokenizer.h"
#include "hyperparallel/platform/user_error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hyperparallel::fuzz::write_input(data, size, "_tokenizer.json");
  try {
    const auto tokenizer = hyperparallel::data::Tokenizer::from_file(path);
    const std::string texts[] = {"Hello world! 123", std::string(reinterpret_cast<const char*>(data), std::min<size_t>(size, 64)),
                                 "<|im_start|>user\n\xff\xfe caf\xc3\xa9<|im_end|>"};
    for (const auto& text : texts) {
      const auto ids = tokenizer.encode(text, true);
      for (int64_t id : ids) {
        if (id < 0 || id >= tokenizer.vocab_size()) __builtin_trap();
      }
      tokenizer.decode(ids);
    }
  } catch (const hyperparallel::UserError&) {
  }
  return 0;
}
