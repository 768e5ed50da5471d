// TCP ports for the rendezvous store.
//
// find_free_port() names a port that is free on 127.0.0.1 right now; another process may
// take it before it is bound (tests use it for "nobody listens there").
//
// ReservedPort closes that window for the launcher: it binds a kernel-chosen port (with
// SO_REUSEADDR, not listening) and keeps the socket open, and the launcher hands it to rank 0
// by inheritance (`kStoreListenFdVar` names its descriptor); our rank 0 listens on it, so the
// port the ranks are told is the one rank 0's store serves: no other process binds it in
// between, and the kernel hands it to no one as an ephemeral port. Not listening is deliberate:
// a rank 0 that is not ours (`hyperparallel run -- python train.py`, whose c10d TCPStore binds
// MASTER_PORT with SO_REUSEADDR) can still take the port, which a listening socket would
// refuse. Clients that connect before rank 0 listens are refused and retry.
#pragma once

#include <string>

namespace hyperparallel::launch {

int find_free_port();

// Environment variable through which the launcher tells rank 0 the inherited listening socket.
inline constexpr const char* kStoreListenFdVar = "HP_STORE_LISTEN_FD";

class ReservedPort {
 public:
  // Binds host:0 (not listening). Returns an empty reservation (fd() < 0) when host is not
  // an IPv4 address of this machine; rank 0 then binds the port itself and reports why.
  static ReservedPort on(const std::string& host);

  ReservedPort() = default;
  ReservedPort(ReservedPort&& other) noexcept;
  ReservedPort& operator=(ReservedPort&& other) noexcept;
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
  ~ReservedPort();

  int fd() const { return fd_; }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace hyperparallel::launch
