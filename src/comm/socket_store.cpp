// The rendezvous store's client (a c10d::Store). See socket_store.h; the wire format is
// store_protocol.h, the server store_server.cpp.
#include "socket_store.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "hyperparallel/comm/comm_handle.h"
#include "store_protocol.h"

namespace hyperparallel::comm {

using store::Op;
using store::Reader;
using store::Status;
using store::Writer;

SocketStore::SocketStore(const std::string& host, int port, std::chrono::milliseconds timeout)
    : c10d::Store(timeout), host_(host), port_(port) {
  const sockaddr_in addr = store::resolve(host, port);
  where_ = host + ":" + std::to_string(port);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ >= 0 && connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) break;
    const int err = errno;
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    if (std::chrono::steady_clock::now() >= deadline) {
      throw std::runtime_error(std::string("connect: ") + std::strerror(err));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

SocketStore::~SocketStore() {
  if (fd_ >= 0) close(fd_);
}

c10::intrusive_ptr<c10d::Store> SocketStore::clone() {
  return c10::make_intrusive<SocketStore>(host_, port_, timeout_);
}

void SocketStore::interrupt() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

std::vector<uint8_t> SocketStore::request(const std::vector<uint8_t>& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint8_t> reply;
  if (!store::send_frame(fd_, message) || !store::recv_frame(fd_, reply) || reply.empty()) {
    throw CommError("the rendezvous store at " + where_ + " closed the connection (rank 0 may have exited)");
  }
  if (reply[0] == static_cast<uint8_t>(Status::kError)) {
    Reader in(reply);
    in.u8();
    throw StoreRefused("the rendezvous store at " + where_ + " refused a request: " + in.str());
  }
  return reply;
}

void SocketStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  request(Writer().u8(static_cast<uint8_t>(Op::kSet)).str(key).vec(value).bytes);
}

std::vector<uint8_t> SocketStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                             const std::vector<uint8_t>& desired) {
  const auto reply = request(Writer().u8(static_cast<uint8_t>(Op::kCompareSet)).str(key).vec(expected).vec(desired).bytes);
  Reader in(reply);
  in.u8();
  return in.vec();
}

std::vector<uint8_t> SocketStore::get(const std::string& key) {
  const auto reply = request(Writer().u8(static_cast<uint8_t>(Op::kGet)).str(key).i64(timeout_.count()).bytes);
  Reader in(reply);
  if (in.u8() != static_cast<uint8_t>(Status::kOk)) {
    throw CommError("rendezvous store: key '" + key + "' did not appear within " +
                    std::to_string(timeout_.count()) + " ms (a rank did not join?)");
  }
  return in.vec();
}

int64_t SocketStore::add(const std::string& key, int64_t value) {
  const auto reply = request(Writer().u8(static_cast<uint8_t>(Op::kAdd)).str(key).i64(value).bytes);
  Reader in(reply);
  in.u8();
  return in.i64();
}

bool SocketStore::deleteKey(const std::string& key) {
  const auto reply = request(Writer().u8(static_cast<uint8_t>(Op::kDelete)).str(key).bytes);
  Reader in(reply);
  in.u8();
  return in.u8() != 0;
}

bool SocketStore::check(const std::vector<std::string>& keys) {
  Writer w;
  w.u8(static_cast<uint8_t>(Op::kCheck)).i64(static_cast<int64_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  const auto reply = request(w.bytes);
  Reader in(reply);
  in.u8();
  return in.u8() != 0;
}

int64_t SocketStore::getNumKeys() {
  const auto reply = request(Writer().u8(static_cast<uint8_t>(Op::kNumKeys)).bytes);
  Reader in(reply);
  in.u8();
  return in.i64();
}

void SocketStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void SocketStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  Writer w;
  w.u8(static_cast<uint8_t>(Op::kWait)).i64(static_cast<int64_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  w.i64(timeout.count());
  const auto reply = request(w.bytes);
  if (Reader(reply).u8() != static_cast<uint8_t>(Status::kOk)) {
    throw CommError("rendezvous store: waiting for " + std::to_string(keys.size()) + " key(s) timed out after " +
                    std::to_string(timeout.count()) + " ms (a rank did not join?)");
  }
}

}  // namespace hyperparallel::comm
