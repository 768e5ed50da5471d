#include "hyperparallel/comm/rendezvous.h"

#include <arpa/inet.h>
#include <signal.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "agent_store.h"
#include "group_registry.h"
#include "socket_store.h"
#include "hyperparallel/launch/free_port.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::comm {
namespace {

int parse_int(const EnvLookup& env, const std::string& name, int min_value) {
  const std::optional<std::string> text = env(name);
  if (!text) throw UserError("environment variable " + name + " is not set");
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text->c_str(), &end, 10);
  if (text->empty() || *end != '\0' || errno != 0 || value < min_value || value > 1'000'000) {
    throw UserError("environment variable " + name + "='" + *text + "' is not an integer >= " +
                    std::to_string(min_value));
  }
  return static_cast<int>(value);
}

int parse_int_or(const EnvLookup& env, const std::string& name, int min_value, int fallback) {
  return env(name) ? parse_int(env, name, min_value) : fallback;
}

void read_master(const EnvLookup& env, RendezvousInfo& info, bool single_node_known) {
  if (auto addr = env("MASTER_ADDR")) {
    if (addr->empty()) throw UserError("environment variable MASTER_ADDR is empty; set it to rank 0's host");
    info.master_addr = *addr;
  } else if (!single_node_known && info.world_size > 1) {
    throw UserError("MASTER_ADDR is not set; with " + info.source +
                    " set MASTER_ADDR (and MASTER_PORT) to the address of the node that runs rank 0");
  }
  info.master_port = parse_int_or(env, "MASTER_PORT", 1, info.master_port);
  if (info.master_port > 65535) {
    throw UserError("environment variable MASTER_PORT=" + std::to_string(info.master_port) + " is not a TCP port (1-65535)");
  }
}

void check_ranks(const RendezvousInfo& info, const std::string& rank_var, const std::string& size_var) {
  if (info.rank >= info.world_size) {
    throw UserError(rank_var + "=" + std::to_string(info.rank) + " is not below " + size_var + "=" +
                    std::to_string(info.world_size));
  }
  if (info.local_rank >= info.local_world_size) {
    throw UserError("local rank " + std::to_string(info.local_rank) + " is not below the local world size " +
                    std::to_string(info.local_world_size));
  }
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

// The local address this host uses to reach `host` (no packet is sent: connect() on a UDP
// socket only picks the route). Gloo binds its pairs there, so multi-host runs work without
// naming an interface.
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) {
    throw UserError("MASTER_ADDR '" + host + "' does not resolve to an IPv4 address");
  }
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  std::string local;
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in me{};
    socklen_t len = sizeof(me);
    char text[INET_ADDRSTRLEN] = {0};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
        inet_ntop(AF_INET, &me.sin_addr, text, sizeof(text))) {
      local = text;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  if (local.empty()) throw UserError("no network route to MASTER_ADDR '" + host + "'");
  return local;
}

std::shared_ptr<::gloo::transport::Device> make_device(const RendezvousInfo& info) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  if (info.world_size == 1 || is_loopback(info.master_addr)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDeviceForHostname(local_address_towards(info.master_addr, info.master_port));
}

struct Store {
  c10::intrusive_ptr<c10d::Store> client;
  std::shared_ptr<StoreServer> server;  // rank 0 only
  StoreAddress address;                 // where `client` is connected
};

Store make_store(const RendezvousInfo& info, const CommOptions& options) {
  if (info.world_size == 1) return {c10::make_intrusive<c10d::HashStore>(), nullptr, {}};
  Store store;
  store.address = {info.master_addr, info.master_port};
  // Bind exactly the master address: 127.0.0.1 for a local job, never every interface.
  const std::string bind_host = is_loopback(info.master_addr) ? "127.0.0.1" : info.master_addr;
  if (!info.agent_store_key.empty()) {
    // torchrun's agent serves MASTER_PORT: ours goes on a free port, its address through the agent.
    if (info.rank == 0) store.server = std::make_shared<StoreServer>(bind_host, 0);
    const StoreAddress ours{bind_host, store.server ? store.server->port() : 0};
    store.address = exchange_through_agent_store(store.address, info.agent_store_key, info.rank, ours, options.rendezvous_timeout);
  } else if (info.rank == 0) {
    store.server = std::make_shared<StoreServer>(bind_host, info.master_port, info.store_listen_fd);
    unsetenv(launch::kStoreListenFdVar);  // served now; a later group in this process binds its own
  }
  const std::string where = store.address.host + ":" + std::to_string(store.address.port);
  try {
    store.client = c10::make_intrusive<SocketStore>(store.address.host, store.address.port, options.rendezvous_timeout);
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(options.rendezvous_timeout).count();
    throw UserError("rank " + std::to_string(info.rank) + " could not reach the rendezvous store at " + where +
                    " within " + std::to_string(seconds) +
                    " s; check MASTER_ADDR/MASTER_PORT and that rank 0 is running (" + e.what() + ")");
  }
  return store;
}

// The variable names one launcher uses.
struct LauncherVars {
  const char* source;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

RendezvousInfo read_launcher_vars(const EnvLookup& env, const LauncherVars& vars) {
  RendezvousInfo info;
  info.source = vars.source;
  info.rank = parse_int(env, vars.rank, 0);
  info.world_size = parse_int(env, vars.world_size, 1);
  info.local_rank = parse_int_or(env, vars.local_rank, 0, info.rank);
  info.local_world_size = parse_int_or(env, vars.local_world_size, 1, info.world_size);
  check_ranks(info, vars.rank, vars.world_size);
  read_master(env, info, info.local_world_size == info.world_size);
  return info;
}

// The watchdog's default: say who was lost and end this process (a Gloo collective blocked
// on a vanished peer cannot be cancelled); the launcher then stops the other local ranks.
PeerLiveness::OnLost stop_this_rank(int rank) {
  return [rank](const std::string& message) {
    std::fprintf(stderr, "hyperparallel watchdog on rank %d: %s; ending this rank (heartbeat_timeout_s)\n", rank, message.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  };
}

}  // namespace

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (!value) return std::nullopt;
    return std::string(value);
  };
}

namespace {

RendezvousInfo read_launcher_environment(const EnvLookup& env) {
  RendezvousInfo info;
  if (env("RANK") || env("WORLD_SIZE")) {
    if (!env("RANK") || !env("WORLD_SIZE")) {
      throw UserError(std::string(env("RANK") ? "RANK" : "WORLD_SIZE") + " is set but " +
                      (env("RANK") ? "WORLD_SIZE" : "RANK") + " is not; set both (torchrun-style) or neither");
    }
    info = read_launcher_vars(env, {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"});
    const std::string agent = env("TORCHELASTIC_USE_AGENT_STORE").value_or("");
    if (agent == "True" || agent == "true" || agent == "1") {
      info.agent_store_key = agent_store_key(env("TORCHELASTIC_RUN_ID").value_or("none"), env("TORCHELASTIC_RESTART_COUNT").value_or("0"));
    }
    return info;
  }
  if (env("OMPI_COMM_WORLD_RANK")) {
    return read_launcher_vars(env, {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"});
  }
  if (env("SLURM_PROCID")) {
    info.source = "Slurm";
    info.rank = parse_int(env, "SLURM_PROCID", 0);
    info.world_size = parse_int(env, "SLURM_NTASKS", 1);
    info.local_rank = parse_int_or(env, "SLURM_LOCALID", 0, info.rank);
    const int nodes = parse_int_or(env, "SLURM_NNODES", 1, 1);
    // SLURM_NTASKS_PER_NODE may read "2(x3)"; tasks spread evenly over nodes is what srun does.
    info.local_world_size = std::max(1, info.world_size / nodes);
    check_ranks(info, "SLURM_PROCID", "SLURM_NTASKS");
    read_master(env, info, nodes == 1);
    return info;
  }
  return info;
}

}  // namespace

RendezvousInfo rendezvous_info_from_env(const EnvLookup& env) {
  RendezvousInfo info = read_launcher_environment(env);
  if (info.rank == 0 && env(launch::kStoreListenFdVar)) {
    // Not the user's to set; a value that is not a descriptor is simply not used.
    const std::string text = *env(launch::kStoreListenFdVar);
    char* end = nullptr;
    const long fd = std::strtol(text.c_str(), &end, 10);
    if (!text.empty() && *end == '\0' && fd >= 0 && fd < 1'000'000) info.store_listen_fd = static_cast<int>(fd);
  }
  return info;
}

std::shared_ptr<Communicator> init_process_group(const RendezvousInfo& info, const CommOptions& options) {
  // Gloo writes to its peers' sockets without MSG_NOSIGNAL: with SIGPIPE at its default, a
  // peer that dies kills this rank too, and the launcher may name it instead of the peer.
  // Ignore it unless the program has chosen a handler (docs/comm.md "Rendezvous").
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  if (info.world_size < 1 || info.rank < 0 || info.rank >= info.world_size) {
    throw UserError("rank " + std::to_string(info.rank) + " is outside the world size " + std::to_string(info.world_size));
  }
  Store store = make_store(info, options);
  auto registry = std::make_shared<GroupRegistry>(store.client, make_device(info), info.rank, info.world_size,
                                                  options, store.server);
  std::shared_ptr<PeerLiveness> liveness;
  if (info.world_size > 1) {
    // Its own connection: heartbeats never queue behind another thread's blocking store wait.
    const std::string where = store.address.host + ":" + std::to_string(store.address.port);
    liveness = std::make_shared<PeerLiveness>(
        c10::make_intrusive<SocketStore>(store.address.host, store.address.port, options.rendezvous_timeout), where, info.rank);
    registry->set_liveness(liveness);
  }
  std::vector<int> all(info.world_size);
  for (int r = 0; r < info.world_size; ++r) all[r] = r;
  auto world = registry->get_or_create(all, "world");
  // Watch only once every rank has joined: a slow starter is the rendezvous timeout's business.
  if (liveness && options.heartbeat_timeout.count() > 0) {
    liveness->watch(all, options.heartbeat_timeout, options.on_peer_lost ? options.on_peer_lost : stop_this_rank(info.rank));
  }
  return world;
}

}  // namespace hyperparallel::comm
