// Rendezvous under torchrun's agent store.
//
// torchrun (torch.distributed.run) hosts a c10d TCPStore at MASTER_ADDR:MASTER_PORT in its
// agent process and tells the workers so with TORCHELASTIC_USE_AGENT_STORE=True: the port is
// taken, and rank 0 must not bind it. Our own store (socket_store.h: bounded frames, a
// liveness watchdog, hardening against hostile clients) still does the job's rendezvous: rank
// 0 serves it on a free port and publishes "host:port" in the agent's store under a key
// scoped by TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT (a restarted worker group
// never reads its predecessor's address); every other rank reads the key (blocking up to the
// rendezvous timeout) and connects there. The agent's store is used through LibTorch's
// c10d::TCPStore client for this one key, nothing else.
#pragma once

#include <chrono>
#include <string>

namespace hyperparallel::comm {

struct StoreAddress {
  std::string host;
  int port = 0;
};

// The key rank 0 publishes under.
std::string agent_store_key(const std::string& run_id, const std::string& restart_count);

// Rank 0: publish `ours`. Others: wait for it. UserError naming the agent's address when it
// cannot be reached or the key does not appear within `timeout`.
StoreAddress exchange_through_agent_store(const StoreAddress& agent, const std::string& key, int rank, const StoreAddress& ours,
                                          std::chrono::milliseconds timeout);

}  // namespace hyperparallel::comm
