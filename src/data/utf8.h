// UTF-8 helpers for the tokenizer: code point iteration, encoding, Rust's lossy decoding
// (each maximal invalid subsequence becomes one U+FFFD, as String::from_utf8_lossy does), and
// GPT-2's byte-level alphabet (every byte as a printable code point).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace hyperparallel::data {

// Length in bytes of the (possibly invalid) UTF-8 sequence starting at s[i]; at least 1.
size_t utf8_char_length(const std::string& s, size_t i);
void append_utf8(std::string& out, uint32_t code_point);
std::string utf8_lossy(const std::string& bytes);
// Byte offset of the first ill-formed sequence in `s`; std::string::npos when it is all valid.
size_t utf8_first_invalid(const std::string& s);

// byte -> code point of the byte-level alphabet, and its inverse.
class ByteLevelAlphabet {
 public:
  ByteLevelAlphabet();
  const std::string& encode_byte(unsigned char b) const { return byte_to_utf8_[b]; }
  std::string encode(const std::string& bytes) const;
  // Maps each character back to its byte; characters outside the alphabet keep their bytes.
  std::string decode(const std::string& text) const;

 private:
  std::array<std::string, 256> byte_to_utf8_;
  std::unordered_map<uint32_t, unsigned char> code_point_to_byte_;
};

}  // namespace hyperparallel::data
