// A 128-bit content fingerprint. See content_hash.h.
#include "content_hash.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "hyperparallel/io/user_files.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::io {
namespace {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ull, kPrime2 = 0xC2B2AE3D27D4EB4Full;

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

uint64_t finish(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

void ContentHash::mix(const char* data, size_t size) {
  // Two lanes over 8-byte words, the tail zero-padded; the running length goes in at the end.
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t w;
    std::memcpy(&w, data + i, 8);
    a_ = rotl(a_ ^ (w * kPrime2), 31) * kPrime1;
    b_ = rotl(b_ + w, 27) * kPrime2 ^ a_;
  }
  if (i < size) {
    uint64_t w = 0;
    std::memcpy(&w, data + i, size - i);
    a_ = rotl(a_ ^ (w * kPrime2), 31) * kPrime1;
    b_ = rotl(b_ + w, 27) * kPrime2 ^ a_;
  }
  length_ += size;
}

ContentHash& ContentHash::add(std::string_view bytes) {
  add(static_cast<int64_t>(bytes.size()));
  mix(bytes.data(), bytes.size());
  return *this;
}

ContentHash& ContentHash::add(int64_t value) {
  mix(reinterpret_cast<const char*>(&value), sizeof value);
  return *this;
}

ContentHash& ContentHash::add_file(const std::string& path) {
  const OpenedFile file = open_user_file(path, "the file");
  const int fd = file.fd;
  add(static_cast<int64_t>(file.size));
  std::vector<char> piece(4u << 20);
  for (;;) {
    const ssize_t n = ::read(fd, piece.data(), piece.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw UserError(path + ": read failed (" + why + ")");
    }
    if (n == 0) break;
    mix(piece.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return *this;
}

std::string ContentHash::hex() const {
  static const char* digits = "0123456789abcdef";
  const uint64_t words[2] = {finish(a_ ^ length_), finish(b_ + a_ + length_ * kPrime1)};
  std::string out;
  for (uint64_t w : words) {
    for (int shift = 60; shift >= 0; shift -= 4) out += digits[(w >> shift) & 15];
  }
  return out;
}

}  // namespace hyperparallel::io
