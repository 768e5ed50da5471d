// The rendezvous key-value store: a small TCP server that rank 0 runs, and a c10d::Store
// client that every rank (rank 0 too) uses to reach it.
//
// Why not c10d's TCPStore: in LibTorch 1.13 its server listens on every interface. Ours binds
// exactly the master address — 127.0.0.1 for single-node jobs — so nothing outside the host
// can reach a local job's store (docs/comm.md "Rendezvous").
// Protocol: one request, one reply, over a persistent connection; strings and byte values
// are length-prefixed. Blocking requests (get, wait) carry their timeout and block on the
// server thread that serves the connection; one thread per client connection (a job has
// one connection per rank). The server owns its threads and joins them in its destructor.
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

namespace hyperparallel::comm {

class StoreServer {
 public:
  // Binds host:port (an IPv4 address or a name that resolves to one of this host's
  // addresses; port 0: the kernel picks, see port()); throws UserError with the fix when it
  // cannot. listening_fd: a socket already listening on port (handed down by the launcher,
  // launch/free_port.h) to serve instead; when it is not one, host:port is bound.
  StoreServer(const std::string& host, int port, int listening_fd = -1);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  const std::string& bound_address() const { return bound_address_; }
  int port() const { return port_; }

 private:
  bool adopt(int listening_fd);
  void bind_and_listen(const std::string& host);
  void accept_loop();
  void serve(int fd);

  std::string bound_address_;
  int port_ = 0;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;  // guards data_, client_fds_ and threads_
  std::condition_variable changed_;
  std::map<std::string, std::vector<uint8_t>> data_;
  std::vector<int> client_fds_;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

class SocketStore : public c10d::Store {
 public:
  // Connects, retrying while the server is not up yet, until `timeout` has passed.
  SocketStore(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~SocketStore() override;

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

  std::string where_;
  int fd_ = -1;
  std::mutex mutex_;
};

}  // namespace hyperparallel::comm
