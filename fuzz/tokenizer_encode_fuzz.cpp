// libFuzzer target: any bytes as text for the project's byte-level BPE tokenizer
// (examples/tokenizer, NFC normalizer). Encoding never fails and ids stay inside the
// vocabulary; for valid UTF-8, decoding gives back exactly the NFC form of the input
// (byte-level BPE is lossless; invalid bytes decode to U+FFFD as in Hugging Face's library).
#include <utf8proc.h>

#include <cstdlib>

#include "data/utf8.h"
#include "hyperparallel/data/tokenizer.h"

#ifndef HP_FUZZ_TOKENIZER
#error "HP_FUZZ_TOKENIZER must name examples/tokenizer"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tokenizer = hyperparallel::data::Tokenizer::from_file(HP_FUZZ_TOKENIZER);
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto ids = tokenizer.encode(text);
  for (int64_t id : ids) {
    if (id < 0 || id >= tokenizer.vocab_size()) __builtin_trap();
  }
  const std::string decoded = tokenizer.decode(ids);
  if (text.find('\0') == std::string::npos && hyperparallel::data::utf8_lossy(text) == text) {
    utf8proc_uint8_t* nfc = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(text.c_str()));
    if (nfc) {
      const bool same = decoded == reinterpret_cast<const char*>(nfc);
      std::free(nfc);
      if (!same) __builtin_trap();
    }
  }
  return 0;
}
