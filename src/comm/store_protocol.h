// The rendezvous store's wire protocol, shared by its server and its client.
//
// A message is a frame: [u32 length][payload]. A request's payload starts with an Op byte, a
// reply's with a Status byte; strings and byte values are [i64 length][bytes]. A frame longer
// than kMaxFrame is a protocol error, and frames are read in pieces as their bytes arrive, so
// a header announcing a large frame costs nothing until the bytes come (no zero-filled buffer
// up front). An error reply carries a message; the connection stays usable.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hyperparallel::comm::store {

enum class Op : uint8_t { kSet = 1, kGet, kAdd, kCheck, kWait, kCompareSet, kDelete, kNumKeys };
enum class Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

// The largest frame either side accepts. The job's own values are addresses and counters
// (bytes to a few KiB); 4 MiB leaves room and bounds what one connection can make us hold.
constexpr uint32_t kMaxFrame = 4u << 20;

class Writer {
 public:
  Writer& u8(uint8_t v);
  Writer& i64(int64_t v);
  Writer& blob(const void* data, size_t n);
  Writer& str(const std::string& s) { return blob(s.data(), s.size()); }
  Writer& vec(const std::vector<uint8_t>& v) { return blob(v.data(), v.size()); }
  std::vector<uint8_t> bytes;
};

// Throws std::runtime_error("store: malformed message") on a short or inconsistent payload.
class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : bytes_(b) {}
  uint8_t u8();
  int64_t i64();
  std::vector<uint8_t> vec();
  std::string str();

 private:
  void need(size_t n) const;
  const std::vector<uint8_t>& bytes_;
  size_t pos_ = 0;
};

bool send_frame(int fd, const std::vector<uint8_t>& payload);
// False when the peer closed, the socket failed, or the frame is over kMaxFrame.
bool recv_frame(int fd, std::vector<uint8_t>& payload);

// host (an IPv4 address or a name) and port; UserError naming MASTER_ADDR when it does not resolve.
sockaddr_in resolve(const std::string& host, int port);
std::string text_of(const sockaddr_in& addr);

}  // namespace hyperparallel::comm::store
