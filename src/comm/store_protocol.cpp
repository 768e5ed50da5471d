#include "store_protocol.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::comm::store {
namespace {

constexpr size_t kReadPiece = 64u << 10;

bool read_exact(int fd, uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t got = recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool write_exact(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t sent = send(fd, p, n, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    p += sent;
    n -= static_cast<size_t>(sent);
  }
  return true;
}

}  // namespace

Writer& Writer::u8(uint8_t v) {
  bytes.push_back(v);
  return *this;
}

Writer& Writer::i64(int64_t v) {
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
  return *this;
}

Writer& Writer::blob(const void* data, size_t n) {
  i64(static_cast<int64_t>(n));
  const auto* p = static_cast<const uint8_t*>(data);
  bytes.insert(bytes.end(), p, p + n);
  return *this;
}

uint8_t Reader::u8() {
  need(1);
  return bytes_[pos_++];
}

int64_t Reader::i64() {
  need(8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(bytes_[pos_ + i]) << (8 * i);
  pos_ += 8;
  return static_cast<int64_t>(v);
}

std::vector<uint8_t> Reader::vec() {
  const int64_t n = i64();
  if (n < 0 || static_cast<uint64_t>(n) > bytes_.size() - pos_) throw std::runtime_error("store: malformed message");
  std::vector<uint8_t> v(bytes_.begin() + static_cast<long>(pos_), bytes_.begin() + static_cast<long>(pos_ + n));
  pos_ += static_cast<size_t>(n);
  return v;
}

std::string Reader::str() {
  auto v = vec();
  return std::string(v.begin(), v.end());
}

void Reader::need(size_t n) const {
  if (bytes_.size() - pos_ < n) throw std::runtime_error("store: malformed message");
}

bool send_frame(int fd, const std::vector<uint8_t>& payload) {
  const uint32_t n = static_cast<uint32_t>(payload.size());
  return write_exact(fd, &n, 4) && write_exact(fd, payload.data(), payload.size());
}

bool recv_frame(int fd, std::vector<uint8_t>& payload) {
  uint32_t n = 0;
  if (!read_exact(fd, reinterpret_cast<uint8_t*>(&n), 4) || n > kMaxFrame) return false;
  payload.clear();
  // Grow as the bytes arrive: memory follows what the peer really sent.
  while (payload.size() < n) {
    const size_t have = payload.size(), piece = std::min<size_t>(kReadPiece, n - have);
    payload.resize(have + piece);
    if (!read_exact(fd, payload.data() + have, piece)) return false;
  }
  return true;
}

sockaddr_in resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) {
    throw UserError("master address '" + host + "' does not resolve to an IPv4 address; check MASTER_ADDR");
  }
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  freeaddrinfo(res);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

std::string text_of(const sockaddr_in& addr) {
  char text[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
  return text;
}

}  // namespace hyperparallel::comm::store
