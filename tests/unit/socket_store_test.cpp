// The rendezvous store: every c10d::Store operation, timeouts, a hostile client, and the
// server binding only the master address (127.0.0.1 for local jobs).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "comm/socket_store.h"
#include "hyperparallel/comm/comm_handle.h"
#include "hyperparallel/launch/free_port.h"
#include "hyperparallel/platform/user_error.h"
#include "support/multiprocess.h"

namespace hyperparallel {
namespace {

using comm::SocketStore;
using comm::StoreServer;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// Local addresses (as dotted quads) that listen on `port`, read from /proc/net/tcp.
std::vector<std::string> listening_addresses(int port) {
  std::ifstream f("/proc/net/tcp");
  std::string line;
  std::getline(f, line);  // header
  std::vector<std::string> found;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state;
    in >> slot >> local >> remote >> state;
    if (state != "0A") continue;  // LISTEN
    const auto colon = local.find(':');
    if (std::stoi(local.substr(colon + 1), nullptr, 16) != port) continue;
    in_addr addr{};
    addr.s_addr = static_cast<in_addr_t>(std::stoul(local.substr(0, colon), nullptr, 16));
    found.push_back(inet_ntoa(addr));
  }
  return found;
}

TEST(SocketStore, EveryOperation) {
  StoreServer server("127.0.0.1", 0);
  const int port = server.port();
  SocketStore a("127.0.0.1", port, std::chrono::seconds(5));
  SocketStore b("127.0.0.1", port, std::chrono::seconds(5));
  a.set("k", bytes("v1"));
  EXPECT_EQ(b.get("k"), bytes("v1"));
  EXPECT_EQ(a.add("n", 3), 3);
  EXPECT_EQ(b.add("n", 4), 7);
  EXPECT_TRUE(b.check({"k", "n"}));
  EXPECT_FALSE(b.check({"k", "missing"}));
  EXPECT_EQ(a.compareSet("k", bytes("v1"), bytes("v2")), bytes("v2"));
  EXPECT_EQ(a.compareSet("k", bytes("nope"), bytes("v3")), bytes("v2"));
  EXPECT_EQ(a.compareSet("fresh", {}, bytes("x")), bytes("x"));
  EXPECT_EQ(a.getNumKeys(), 3);
  EXPECT_TRUE(a.deleteKey("fresh"));
  EXPECT_FALSE(a.deleteKey("fresh"));
  // A blocking get is answered when another client sets the key.
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    b.set("late", bytes("here"));
  });
  EXPECT_EQ(a.get("late"), bytes("here"));
  setter.join();
  a.wait({"k", "late"}, std::chrono::milliseconds(100));
}

TEST(SocketStore, MissingKeysTimeOutWithAMessage) {
  StoreServer server("127.0.0.1", 0);
  const int port = server.port();
  SocketStore a("127.0.0.1", port, std::chrono::milliseconds(300));
  try {
    a.get("never");
    ADD_FAILURE() << "get returned for a key nobody set";
  } catch (const comm::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("key 'never' did not appear within 300 ms"), std::string::npos) << e.what();
  }
  EXPECT_THROW(a.wait({"never"}, std::chrono::milliseconds(100)), comm::CommError);
}

TEST(SocketStore, AHostileClientDoesNotHurtTheServer) {
  StoreServer server("127.0.0.1", 0);
  const int port = server.port();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const uint32_t huge = 0xFFFFFFF0u;  // a frame length far beyond the limit
  ASSERT_EQ(write(fd, &huge, 4), 4);
  const char junk[] = "\x05\x01\x02garbage";
  (void)!write(fd, junk, sizeof(junk));
  char buf[1];
  EXPECT_LE(read(fd, buf, 1), 0);  // the server dropped the connection
  close(fd);
  SocketStore ok("127.0.0.1", port, std::chrono::seconds(2));
  ok.set("still", bytes("fine"));
  EXPECT_EQ(ok.get("still"), bytes("fine"));
}

TEST(SocketStore, ServerBindsOnlyTheMasterAddress) {
  StoreServer server("127.0.0.1", 0);
  const int port = server.port();
  EXPECT_EQ(listening_addresses(port), std::vector<std::string>{"127.0.0.1"});
  try {
    StoreServer second("127.0.0.1", port);
    ADD_FAILURE() << "two servers bound one port";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("is in use; set MASTER_PORT to a free port"), std::string::npos) << e.what();
  }
}

// Binds 127.0.0.1:port on a fresh socket, with or without SO_REUSEADDR; true when it bound.
static bool can_bind(int port, bool reuse_address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  if (reuse_address) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return bound;
}

TEST(SocketStore, ServesTheSocketTheLauncherHandsDown) {
  launch::ReservedPort reserved = launch::ReservedPort::on("127.0.0.1");
  ASSERT_GE(reserved.fd(), 0);
  // Bound before any server exists: a program binding it plainly is refused; one that binds
  // with SO_REUSEADDR, as c10d's TCPStore in a PyTorch rank 0 does, may take it.
  EXPECT_TRUE(listening_addresses(reserved.port()).empty());
  EXPECT_FALSE(can_bind(reserved.port(), /*reuse_address=*/false));
  EXPECT_TRUE(can_bind(reserved.port(), /*reuse_address=*/true));
  // A client may start before the server is up; it retries until the server listens.
  std::unique_ptr<SocketStore> early;
  std::thread client([&] { early = std::make_unique<SocketStore>("127.0.0.1", reserved.port(), std::chrono::seconds(5)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  StoreServer server("127.0.0.1", reserved.port(), dup(reserved.fd()));
  client.join();
  EXPECT_EQ(server.port(), reserved.port());
  EXPECT_EQ(listening_addresses(reserved.port()), std::vector<std::string>{"127.0.0.1"});
  EXPECT_FALSE(can_bind(reserved.port(), /*reuse_address=*/true));  // listening now: nobody else
  early->set("k", bytes("v"));
  EXPECT_EQ(early->get("k"), bytes("v"));
}

TEST(SocketStore, ADescriptorThatIsNotTheReservedSocketIsNotServed) {
  launch::ReservedPort other = launch::ReservedPort::on("127.0.0.1");
  ASSERT_GE(other.fd(), 0);
  // A socket bound to another port, and a descriptor that is no socket at all: the server
  // binds its own port and leaves the descriptor alone.
  for (const int fd : {other.fd(), 0}) {
    StoreServer server("127.0.0.1", 0, fd);
    EXPECT_NE(server.port(), other.port());
    SocketStore client("127.0.0.1", server.port(), std::chrono::seconds(5));
    client.set("k", bytes("v"));
    EXPECT_EQ(client.get("k"), bytes("v"));
  }
  EXPECT_TRUE(listening_addresses(other.port()).empty());
}

TEST(SocketStore, ALocalJobsStoreListensOnLoopbackOnly) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    if (ctx.rank != 0) return;
    const int port = std::atoi(std::getenv("MASTER_PORT"));
    EXPECT_EQ(listening_addresses(port), std::vector<std::string>{"127.0.0.1"});
  });
}

}  // namespace
}  // namespace hyperparallel