// libFuzzer target: any bytes sent to the rendezvous store's server on one connection (frames
// or not). The server must answer or close, never crash or hang, and keep serving the job's
// clients: every 256 inputs a well-formed client sets and reads a key.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "comm/socket_store.h"
#include "comm/store_protocol.h"

namespace {

hyperparallel::comm::StoreServer& server() {
  static auto* s = new hyperparallel::comm::StoreServer("127.0.0.1", 0);  // lives for the fuzzing process
  return *s;
}

int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) std::abort();
  return fd;
}

void check_still_serves(int port) {
  namespace store = hyperparallel::comm::store;
  const int fd = connect_to(port);
  store::Writer set;
  set.u8(static_cast<uint8_t>(store::Op::kSet)).str("fuzz/alive").str("yes");
  std::vector<uint8_t> reply;
  if (!store::send_frame(fd, set.bytes) || !store::recv_frame(fd, reply) || reply.empty() ||
      reply[0] != static_cast<uint8_t>(store::Status::kOk)) {
    std::fprintf(stderr, "the store stopped serving well-formed requests\n");
    std::abort();
  }
  close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int inputs = 0;
  const int port = server().port();
  const int fd = connect_to(port);
  timeval tv{0, 100 * 1000};  // a request that blocks (a wait) is abandoned after 100 ms
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (size > 0) (void)!send(fd, data, size, MSG_NOSIGNAL);
  shutdown(fd, SHUT_WR);
  char buf[4096];
  while (recv(fd, buf, sizeof(buf), 0) > 0) {
  }
  close(fd);
  if (++inputs % 256 == 0) check_still_serves(port);
  return 0;
}
