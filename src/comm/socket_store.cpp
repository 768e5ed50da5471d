#include "socket_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "hyperparallel/comm/comm_handle.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::comm {
namespace {

enum class Op : uint8_t { kSet = 1, kGet, kAdd, kCheck, kWait, kCompareSet, kDelete, kNumKeys };
enum class Status : uint8_t { kOk = 0, kTimeout = 1 };

// A request/reply body larger than this is a protocol error, not an allocation.
constexpr uint32_t kMaxField = 256u << 20;

class Writer {
 public:
  Writer& u8(uint8_t v) { bytes.push_back(v); return *this; }
  Writer& i64(int64_t v) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
    return *this;
  }
  Writer& blob(const void* data, size_t n) {
    i64(static_cast<int64_t>(n));
    const auto* p = static_cast<const uint8_t*>(data);
    bytes.insert(bytes.end(), p, p + n);
    return *this;
  }
  Writer& str(const std::string& s) { return blob(s.data(), s.size()); }
  Writer& vec(const std::vector<uint8_t>& v) { return blob(v.data(), v.size()); }
  std::vector<uint8_t> bytes;
};

bool read_exact(int fd, void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
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

// Frames: [u32 length][payload]. Readers parse fields from the payload.
bool send_frame(int fd, const std::vector<uint8_t>& payload) {
  const uint32_t n = static_cast<uint32_t>(payload.size());
  return write_exact(fd, &n, 4) && write_exact(fd, payload.data(), payload.size());
}

bool recv_frame(int fd, std::vector<uint8_t>& payload) {
  uint32_t n = 0;
  if (!read_exact(fd, &n, 4) || n > kMaxField) return false;
  payload.resize(n);
  return read_exact(fd, payload.data(), n);
}

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : bytes_(b) {}
  uint8_t u8() { need(1); return bytes_[pos_++]; }
  int64_t i64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(bytes_[pos_ + i]) << (8 * i);
    pos_ += 8;
    return static_cast<int64_t>(v);
  }
  std::vector<uint8_t> vec() {
    const int64_t n = i64();
    if (n < 0 || static_cast<uint64_t>(n) > bytes_.size() - pos_) throw std::runtime_error("store: malformed message");
    std::vector<uint8_t> v(bytes_.begin() + static_cast<long>(pos_), bytes_.begin() + static_cast<long>(pos_ + n));
    pos_ += static_cast<size_t>(n);
    return v;
  }
  std::string str() {
    auto v = vec();
    return std::string(v.begin(), v.end());
  }

 private:
  void need(size_t n) {
    if (bytes_.size() - pos_ < n) throw std::runtime_error("store: malformed message");
  }
  const std::vector<uint8_t>& bytes_;
  size_t pos_ = 0;
};

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

}  // namespace

// ---- server ----------------------------------------------------------------------------

StoreServer::StoreServer(const std::string& host, int port, int listening_fd) : port_(port) {
  if (!adopt(listening_fd)) bind_and_listen(host);
  acceptor_ = std::thread([this] { accept_loop(); });
}

bool StoreServer::adopt(int listening_fd) {
  if (listening_fd < 0) return false;
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  int listening = 0;
  socklen_t flag_len = sizeof(listening);
  const bool usable = getsockname(listening_fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
                      addr.sin_family == AF_INET && ntohs(addr.sin_port) == port_ &&
                      getsockopt(listening_fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &flag_len) == 0 && listening;
  if (!usable) return false;  // not the socket the launcher meant; not ours to close
  fcntl(listening_fd, F_SETFD, FD_CLOEXEC);
  listen_fd_ = listening_fd;
  bound_address_ = text_of(addr);
  return true;
}

void StoreServer::bind_and_listen(const std::string& host) {
  sockaddr_in addr = resolve(host, port_);
  bound_address_ = text_of(addr);
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw std::runtime_error("store: socket() failed");
  const int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(listen_fd_);
    const std::string port = std::to_string(port_);
    if (err == EADDRINUSE) throw UserError("port " + port + " on " + bound_address_ + " is in use; set MASTER_PORT to a free port");
    if (err == EADDRNOTAVAIL) {
      throw UserError("MASTER_ADDR " + host + " (" + bound_address_ +
                      ") is not an address of this host; rank 0 runs the store there, so set MASTER_ADDR to rank 0's address");
    }
    throw UserError("cannot bind the rendezvous store to " + bound_address_ + ":" + port + ": " + std::strerror(err));
  }
  socklen_t len = sizeof(addr);
  if (listen(listen_fd_, 1024) != 0 || getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(listen_fd_);
    throw std::runtime_error("store: listen() failed");
  }
  port_ = ntohs(addr.sin_port);
}

StoreServer::~StoreServer() {
  stopping_ = true;
  shutdown(listen_fd_, SHUT_RDWR);
  close(listen_fd_);
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int fd : client_fds_) shutdown(fd, SHUT_RDWR);
    threads.swap(threads_);
    changed_.notify_all();  // under the lock, so no waiter misses it
  }
  for (auto& t : threads) t.join();
  for (int fd : client_fds_) close(fd);
}

void StoreServer::accept_loop() {
  while (!stopping_) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // closed by the destructor
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      close(fd);
      return;
    }
    client_fds_.push_back(fd);
    threads_.emplace_back([this, fd] { serve(fd); });
  }
}

void StoreServer::serve(int fd) {
  // Whatever ends this loop (peer gone, malformed request, shutdown) ends the connection
  // for the peer too; the fd itself is closed by the destructor.
  struct Hangup {
    int fd;
    ~Hangup() { shutdown(fd, SHUT_RDWR); }
  } hangup{fd};
  std::vector<uint8_t> frame;
  while (!stopping_ && recv_frame(fd, frame)) {
    Writer reply;
    try {
      Reader in(frame);
      const auto op = static_cast<Op>(in.u8());
      std::unique_lock<std::mutex> lock(mutex_);
      switch (op) {
        case Op::kSet: {
          const std::string key = in.str();
          data_[key] = in.vec();
          changed_.notify_all();
          reply.u8(static_cast<uint8_t>(Status::kOk));
          break;
        }
        case Op::kGet:
        case Op::kWait: {
          std::vector<std::string> keys;
          const int64_t count = op == Op::kGet ? 1 : in.i64();
          for (int64_t i = 0; i < count; ++i) keys.push_back(in.str());
          const auto timeout = std::chrono::milliseconds(in.i64());
          auto ready = [&] {
            if (stopping_) return true;
            for (const auto& k : keys) {
              if (!data_.count(k)) return false;
            }
            return true;
          };
          const bool ok = timeout.count() == 0 ? (changed_.wait(lock, ready), true)
                                               : changed_.wait_for(lock, timeout, ready);
          if (!ok || stopping_) {
            reply.u8(static_cast<uint8_t>(Status::kTimeout));
          } else {
            reply.u8(static_cast<uint8_t>(Status::kOk));
            if (op == Op::kGet) reply.vec(data_[keys[0]]);
          }
          break;
        }
        case Op::kAdd: {
          const std::string key = in.str();
          const int64_t delta = in.i64();
          auto& v = data_[key];
          const int64_t now = (v.empty() ? 0 : std::stoll(std::string(v.begin(), v.end()))) + delta;
          const std::string text = std::to_string(now);
          v.assign(text.begin(), text.end());
          changed_.notify_all();
          reply.u8(static_cast<uint8_t>(Status::kOk)).i64(now);
          break;
        }
        case Op::kCheck: {
          const int64_t count = in.i64();
          bool all = true;
          for (int64_t i = 0; i < count; ++i) all = data_.count(in.str()) > 0 && all;
          reply.u8(static_cast<uint8_t>(Status::kOk)).u8(all ? 1 : 0);
          break;
        }
        case Op::kCompareSet: {
          const std::string key = in.str();
          const auto expected = in.vec();
          const auto desired = in.vec();
          auto it = data_.find(key);
          if (it == data_.end()) {
            if (expected.empty()) {
              data_[key] = desired;
              changed_.notify_all();
              reply.u8(static_cast<uint8_t>(Status::kOk)).vec(desired);
            } else {
              reply.u8(static_cast<uint8_t>(Status::kOk)).vec(expected);
            }
          } else {
            if (it->second == expected) {
              it->second = desired;
              changed_.notify_all();
            }
            reply.u8(static_cast<uint8_t>(Status::kOk)).vec(it->second);
          }
          break;
        }
        case Op::kDelete: {
          const bool erased = data_.erase(in.str()) > 0;
          reply.u8(static_cast<uint8_t>(Status::kOk)).u8(erased ? 1 : 0);
          break;
        }
        case Op::kNumKeys:
          reply.u8(static_cast<uint8_t>(Status::kOk)).i64(static_cast<int64_t>(data_.size()));
          break;
        default:
          return;  // unknown request: drop the connection
      }
    } catch (const std::exception&) {
      return;  // malformed request: drop the connection
    }
    if (!send_frame(fd, reply.bytes)) return;
  }
}

// ---- client ----------------------------------------------------------------------------

SocketStore::SocketStore(const std::string& host, int port, std::chrono::milliseconds timeout)
    : c10d::Store(timeout) {
  const sockaddr_in addr = resolve(host, port);
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

void SocketStore::interrupt() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

std::vector<uint8_t> SocketStore::request(const std::vector<uint8_t>& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint8_t> reply;
  if (!send_frame(fd_, message) || !recv_frame(fd_, reply) || reply.empty()) {
    throw CommError("the rendezvous store at " + where_ + " closed the connection (rank 0 may have exited)");
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
