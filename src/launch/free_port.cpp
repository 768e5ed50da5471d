#include "hyperparallel/launch/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>
#include <utility>

namespace hyperparallel::launch {
namespace {

// Binds addr (port 0: the kernel picks) and returns the port, or -1.
int bind_and_name(int fd, sockaddr_in addr) {
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return -1;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  return ntohs(addr.sin_port);
}

sockaddr_in loopback_any_port() {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

}  // namespace

int find_free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("cannot create a socket to find a free port");
  const int port = bind_and_name(fd, loopback_any_port());
  close(fd);
  if (port <= 0) throw std::runtime_error("cannot find a free TCP port on 127.0.0.1");
  return port;
}

ReservedPort ReservedPort::on(const std::string& host) {
  sockaddr_in addr = loopback_any_port();
  if (host != "localhost" && inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) return {};
  if ((ntohl(addr.sin_addr.s_addr) >> 24) == 127) addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ReservedPort reserved;
  reserved.fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (reserved.fd_ < 0) return {};
  const int one = 1;
  setsockopt(reserved.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  // Bound, not listening: no other process can bind the port, but a program of the user's
  // (a PyTorch script whose rank 0 binds MASTER_PORT with SO_REUSEADDR for its TCPStore, as
  // c10d does) may still take it, which a listening socket would refuse. Our rank 0 adopts
  // the socket and listens on it (comm/store_server.cpp).
  reserved.port_ = bind_and_name(reserved.fd_, addr);
  if (reserved.port_ <= 0) return {};
  return reserved;
}

ReservedPort::ReservedPort(ReservedPort&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), port_(std::exchange(other.port_, 0)) {}

ReservedPort& ReservedPort::operator=(ReservedPort&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    port_ = std::exchange(other.port_, 0);
  }
  return *this;
}

ReservedPort::~ReservedPort() {
  if (fd_ >= 0) close(fd_);
}

}  // namespace hyperparallel::launch
