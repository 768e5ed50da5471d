// The rendezvous store's server. See socket_store.h; the wire format is store_protocol.h.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include "hyperparallel/platform/user_error.h"
#include "socket_store.h"
#include "store_protocol.h"

namespace hyperparallel::comm {

using store::Op;
using store::Reader;
using store::Status;
using store::Writer;

namespace {

Writer error_reply(const std::string& message) {
  Writer w;
  w.u8(static_cast<uint8_t>(Status::kError)).str(message);
  return w;
}

// The integer a counter key holds; false when it holds something else.
bool counter_value(const std::vector<uint8_t>& bytes, int64_t& out) {
  if (bytes.empty()) {
    out = 0;
    return true;
  }
  const std::string text(bytes.begin(), bytes.end());
  try {
    size_t used = 0;
    out = std::stoll(text, &used);
    return used == text.size();
  } catch (const std::exception&) {
    return false;
  }
}

// The client closed its side (a read would see the end); data still unread means it is there.
bool peer_left(int fd) {
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace

StoreServer::StoreServer(const std::string& host, int port, int listening_fd, size_t max_connections)
    : port_(port), max_connections_(max_connections) {
  if (!adopt(listening_fd)) bind_and_listen(host);
  acceptor_ = std::thread([this] { accept_loop(); });
}

bool StoreServer::adopt(int listening_fd) {
  if (listening_fd < 0) return false;
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  int type = 0;
  socklen_t type_len = sizeof(type);
  const bool usable = getsockname(listening_fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
                      addr.sin_family == AF_INET && ntohs(addr.sin_port) == port_ &&
                      getsockopt(listening_fd, SOL_SOCKET, SO_TYPE, &type, &type_len) == 0 && type == SOCK_STREAM;
  if (!usable) return false;  // not the socket the launcher meant; not ours to close
  // The launcher hands it over bound, not listening (launch/free_port.h): listen here.
  if (listen(listening_fd, 1024) != 0) return false;
  fcntl(listening_fd, F_SETFD, FD_CLOEXEC);
  listen_fd_ = listening_fd;
  bound_address_ = store::text_of(addr);
  return true;
}

void StoreServer::bind_and_listen(const std::string& host) {
  sockaddr_in addr = store::resolve(host, port_);
  bound_address_ = store::text_of(addr);
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
  std::map<uint64_t, std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [id, fd] : open_) shutdown(fd, SHUT_RDWR);
    threads.swap(threads_);
    changed_.notify_all();  // under the lock, so no waiter misses it
  }
  for (auto& [id, t] : threads) t.join();
}

size_t StoreServer::connections() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return open_.size();
}

void StoreServer::reap_finished() {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (uint64_t id : finished_) {
      auto it = threads_.find(id);
      if (it == threads_.end()) continue;
      done.push_back(std::move(it->second));
      threads_.erase(it);
    }
    finished_.clear();
  }
  for (auto& t : done) t.join();  // each has left serve(); join returns at once
}

void StoreServer::accept_loop() {
  while (!stopping_) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_ || errno == EBADF || errno == EINVAL) return;  // closed by the destructor
      // Out of descriptors, memory or buffers (or an aborted handshake): the pending
      // connection waits in the backlog; try again shortly, never give up serving the job.
      if (errno != EINTR && errno != ECONNABORTED) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      reap_finished();
      continue;
    }
    reap_finished();
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      close(fd);
      return;
    }
    if (open_.size() >= max_connections_) {  // a flood of connections: turn the newest away
      close(fd);
      continue;
    }
    const uint64_t id = next_id_++;
    open_[id] = fd;
    try {
      threads_.emplace(id, std::thread([this, id, fd] { serve(id, fd); }));
    } catch (const std::system_error&) {  // no thread to be had (a pids limit): refuse this one
      open_.erase(id);
      close(fd);
    }
  }
}

void StoreServer::serve(uint64_t id, int fd) {
  std::vector<uint8_t> frame;
  while (!stopping_ && store::recv_frame(fd, frame)) {
    Writer reply;
    try {
      reply = answer(frame, fd);
    } catch (const std::exception& e) {  // a payload that does not parse: say so, keep the connection
      reply = error_reply(std::string("malformed request (") + e.what() + ")");
    }
    if (!store::send_frame(fd, reply.bytes)) break;
  }
  // The connection is over (peer gone, an over-long frame, shutdown): free it now, not at
  // the end of the job; the acceptor joins this thread.
  std::lock_guard<std::mutex> lock(mutex_);
  shutdown(fd, SHUT_RDWR);
  close(fd);
  open_.erase(id);
  finished_.push_back(id);
}

// Waits until `ready` (timeout <= 0 or over a day: no limit), looking every second whether the client is
// still there: a client that left must not keep a thread (and a connection slot) forever.
template <typename Ready>
bool StoreServer::wait_for_keys(std::unique_lock<std::mutex>& lock, Ready& ready, std::chrono::milliseconds timeout, int fd) {
  // Beyond a day is no limit (a client's count of milliseconds must not overflow the clock).
  const bool limited = timeout.count() > 0 && timeout <= std::chrono::hours(24);
  const auto deadline = std::chrono::steady_clock::now() + (limited ? timeout : std::chrono::milliseconds(0));
  while (!ready()) {
    auto slice = std::chrono::milliseconds(1000);
    if (limited) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      slice = std::min(slice, left);
    }
    if (changed_.wait_for(lock, slice, ready)) return true;
    if (peer_left(fd)) return false;
  }
  return true;
}

Writer StoreServer::answer(const std::vector<uint8_t>& frame, int fd) {
  Reader in(frame);
  const auto op = static_cast<Op>(in.u8());
  std::unique_lock<std::mutex> lock(mutex_);
  Writer reply;
  switch (op) {
    case Op::kSet: {
      const std::string key = in.str();
      data_[key] = in.vec();
      changed_.notify_all();
      reply.u8(static_cast<uint8_t>(Status::kOk));
      return reply;
    }
    case Op::kGet:
    case Op::kWait: {
      std::vector<std::string> keys;
      const int64_t count = op == Op::kGet ? 1 : in.i64();
      if (count < 0) throw std::runtime_error("negative key count");
      for (int64_t i = 0; i < count; ++i) keys.push_back(in.str());
      const auto timeout = std::chrono::milliseconds(in.i64());
      auto ready = [&] {
        if (stopping_) return true;
        for (const auto& k : keys) {
          if (!data_.count(k)) return false;
        }
        return true;
      };
      if (!wait_for_keys(lock, ready, timeout, fd) || stopping_) return reply.u8(static_cast<uint8_t>(Status::kTimeout));
      reply.u8(static_cast<uint8_t>(Status::kOk));
      if (op == Op::kGet) reply.vec(data_[keys[0]]);
      return reply;
    }
    case Op::kAdd: {
      const std::string key = in.str();
      const int64_t delta = in.i64();
      auto& v = data_[key];
      int64_t now = 0;
      if (!counter_value(v, now)) return error_reply("add: key '" + key + "' holds a value that is not an integer");
      if (__builtin_add_overflow(now, delta, &now)) return error_reply("add: key '" + key + "' would overflow a 64-bit integer");
      const std::string text = std::to_string(now);
      v.assign(text.begin(), text.end());
      changed_.notify_all();
      return reply.u8(static_cast<uint8_t>(Status::kOk)).i64(now);
    }
    case Op::kCheck: {
      const int64_t count = in.i64();
      bool all = true;
      for (int64_t i = 0; i < count; ++i) all = data_.count(in.str()) > 0 && all;
      return reply.u8(static_cast<uint8_t>(Status::kOk)).u8(all ? 1 : 0);
    }
    case Op::kCompareSet: {
      const std::string key = in.str();
      const auto expected = in.vec();
      const auto desired = in.vec();
      auto it = data_.find(key);
      if (it == data_.end()) {
        if (!expected.empty()) return reply.u8(static_cast<uint8_t>(Status::kOk)).vec(expected);
        data_[key] = desired;
        changed_.notify_all();
        return reply.u8(static_cast<uint8_t>(Status::kOk)).vec(desired);
      }
      if (it->second == expected) {
        it->second = desired;
        changed_.notify_all();
      }
      return reply.u8(static_cast<uint8_t>(Status::kOk)).vec(it->second);
    }
    case Op::kDelete: {
      const bool erased = data_.erase(in.str()) > 0;
      return reply.u8(static_cast<uint8_t>(Status::kOk)).u8(erased ? 1 : 0);
    }
    case Op::kNumKeys:
      return reply.u8(static_cast<uint8_t>(Status::kOk)).i64(static_cast<int64_t>(data_.size()));
  }
  return error_reply("unknown request " + std::to_string(static_cast<int>(op)));
}

}  // namespace hyperparallel::comm
