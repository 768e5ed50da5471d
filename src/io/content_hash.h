// ContentHash: a 128-bit fingerprint of strings and whole files, for cache keys (the
// tokenized-data cache, src/train/tokenized_cache.h). Not cryptographic: it guards against
// accidental reuse (other data, another tokenizer), not against a forger. Every piece is
// length-prefixed, so ("ab", "c") and ("a", "bc") differ. Files are read in 4 MiB pieces
// (a 10 GB dataset hashes in seconds; tokenizing it takes far longer).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace hyperparallel::io {

class ContentHash {
 public:
  ContentHash& add(std::string_view bytes);
  ContentHash& add(int64_t value);
  // The file's size and bytes. UserError naming the file when it is not a readable regular file
  // (io/user_files.h's checks).
  ContentHash& add_file(const std::string& path);
  std::string hex() const;  // 32 lowercase hex digits

 private:
  void mix(const char* data, size_t size);
  uint64_t a_ = 0x243F6A8885A308D3ull, b_ = 0x13198A2E03707344ull;
  uint64_t length_ = 0;
};

}  // namespace hyperparallel::io
