// The rendezvous key-value store: a small TCP server that rank 0 runs, and a c10d::Store
// client that every rank (rank 0 too) uses to reach it.
//
// Why not c10d's TCPStore: its server listens on every interface (1.13 and 2.11 alike). Ours binds
// exactly the master address — 127.0.0.1 for single-node jobs — so nothing outside the host
// can reach a local job's store (docs/comm.md "Rendezvous").
// Protocol (store_protocol.h): one request, one reply, over a persistent connection; frames
// are bounded (4 MiB) and read as their bytes arrive. Blocking requests (get, wait) carry
// their timeout and block on the server thread that serves the connection; one thread per
// client connection (a job has two per rank: requests and heartbeats). A hostile or broken
// client cannot take the store down: a connection that ends is closed and its thread joined
// at once, connections beyond a cap are turned away, a failure to start a thread or to accept
// refuses that one connection, and a request that cannot be served (malformed, unknown, an
// add on a key that holds no integer) is answered with an error and the connection kept.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hyperparallel/comm/comm_handle.h"
#include "store_protocol.h"

namespace hyperparallel::comm {

class StoreServer {
 public:
  // Open connections beyond this are closed at once (a job uses two per rank).
  static constexpr size_t kMaxConnections = 4096;

  // Binds host:port (an IPv4 address or a name that resolves to one of this host's
  // addresses; port 0: the kernel picks, see port()); throws UserError with the fix when it
  // cannot. listening_fd: a socket already listening on port (handed down by the launcher,
  // launch/free_port.h) to serve instead; when it is not one, host:port is bound.
  StoreServer(const std::string& host, int port, int listening_fd = -1, size_t max_connections = kMaxConnections);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  const std::string& bound_address() const { return bound_address_; }
  int port() const { return port_; }
  size_t connections() const;  // client connections open now

 private:
  bool adopt(int listening_fd);
  void bind_and_listen(const std::string& host);
  void accept_loop();
  void reap_finished();
  void serve(uint64_t id, int fd);
  store::Writer answer(const std::vector<uint8_t>& frame, int fd);
  template <typename Ready>
  bool wait_for_keys(std::unique_lock<std::mutex>& lock, Ready& ready, std::chrono::milliseconds timeout, int fd);

  std::string bound_address_;
  int port_ = 0;
  size_t max_connections_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mutex_;  // guards data_, open_, threads_, finished_, next_id_
  std::condition_variable changed_;
  std::map<std::string, std::vector<uint8_t>> data_;
  std::map<uint64_t, int> open_;              // connection id -> its socket
  std::map<uint64_t, std::thread> threads_;   // connection id -> its thread
  std::vector<uint64_t> finished_;            // connections whose thread has ended, to join
  uint64_t next_id_ = 0;
  std::thread acceptor_;
};

// A request the store answered with an error (it is up; the request was refused).
class StoreRefused : public CommError {
 public:
  using CommError::CommError;
};

class SocketStore : public c10d::Store {
 public:
  // Connects, retrying while the server is not up yet, until `timeout` has passed.
  SocketStore(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~SocketStore() override;

  // A second connection to the same server (c10d's ProcessGroupGloo takes one per thread).
  c10::intrusive_ptr<c10d::Store> clone() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // Cuts the connection from any thread: a request blocked on a server that vanished
  // without closing it fails at once, and so does every later one.
  void interrupt();

 private:
  std::vector<uint8_t> request(const std::vector<uint8_t>& message);

  std::string host_;
  int port_ = 0;
  std::string where_;
  int fd_ = -1;
  std::mutex mutex_;
};

}  // namespace hyperparallel::comm
