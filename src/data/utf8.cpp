// UTF-8 helpers. See utf8.h.
#include "utf8.h"

namespace hyperparallel::data {
namespace {

// Decodes one well-formed sequence at s[i]; returns its length, 0 if ill-formed (and then
// `valid_prefix` = how many bytes form a maximal prefix of some valid sequence, >= 1).
size_t decode_one(const std::string& s, size_t i, uint32_t* cp, size_t* valid_prefix) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  *valid_prefix = 1;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t need;
  uint32_t value;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, value = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, value = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, value = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return 0;
    const unsigned char b = byte(i + k);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    value = (value << 6) | (b & 0x3F);
    *valid_prefix = k + 1;
  }
  *cp = value;
  return need + 1;
}

}  // namespace

size_t utf8_char_length(const std::string& s, size_t i) {
  uint32_t cp;
  size_t prefix;
  const size_t n = decode_one(s, i, &cp, &prefix);
  return n ? n : 1;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_lossy(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    uint32_t cp;
    size_t prefix;
    const size_t n = decode_one(bytes, i, &cp, &prefix);
    if (n) {
      out.append(bytes, i, n);
      i += n;
    } else {
      append_utf8(out, 0xFFFD);
      i += prefix;
    }
  }
  return out;
}

size_t utf8_first_invalid(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp;
    size_t prefix;
    const size_t n = decode_one(s, i, &cp, &prefix);
    if (!n) return i;
    i += n;
  }
  return std::string::npos;
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  // GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 to
  // U+0100 upwards in byte order.
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
    append_utf8(byte_to_utf8_[b], cp);
    code_point_to_byte_[cp] = static_cast<unsigned char>(b);
  }
}

std::string ByteLevelAlphabet::encode(const std::string& bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += byte_to_utf8_[b];
  return out;
}

std::string ByteLevelAlphabet::decode(const std::string& text) const {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    uint32_t cp;
    size_t prefix;
    const size_t n = decode_one(text, i, &cp, &prefix);
    auto it = n ? code_point_to_byte_.find(cp) : code_point_to_byte_.end();
    if (it != code_point_to_byte_.end()) {
      out += static_cast<char>(it->second);
    } else {
      out.append(text, i, n ? n : 1);
    }
    i += n ? n : 1;
  }
  return out;
}

}  // namespace hyperparallel::data
