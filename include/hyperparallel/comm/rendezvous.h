// Rendezvous: who am I (rank, world size, local rank) and where is the store, read from
// the environment the way the common launchers set it, and the world Communicator built
// from that.
//
// Sources, first match wins (docs/comm.md "Rendezvous"):
//   torchrun / hyperparallel run: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   Open MPI (mpirun):            OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE (+ MASTER_ADDR/PORT)
//   Slurm (srun):                 SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (+ MASTER_ADDR/PORT)
//   none of them:                 a single process (rank 0 of 1)
// Rank 0 hosts the c10d TCPStore at MASTER_ADDR:MASTER_PORT; a single process needs no store.
// A master that cannot be reached fails with UserError within CommOptions::rendezvous_timeout.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "hyperparallel/comm/communicator.h"

namespace hyperparallel::comm {

struct RendezvousInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single process";  // "torchrun", "Open MPI", "Slurm", "single process"
  // Rank 0 only: the listening socket our launcher bound for master_port and handed down
  // (launch/free_port.h); -1 when rank 0 binds the port itself.
  int store_listen_fd = -1;
  // Under torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True) the agent serves
  // master_port; rank 0 serves ours elsewhere and publishes its address under this key
  // (src/comm/agent_store.h). Empty otherwise.
  std::string agent_store_key;
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_environment();

// Throws UserError naming the variable and the fix on missing or malformed values.
RendezvousInfo rendezvous_info_from_env(const EnvLookup& env = process_environment());

// Creates the store and the world group; blocks until every rank has joined.
std::shared_ptr<Communicator> init_process_group(const RendezvousInfo& info,
                                                 const CommOptions& options = {});

}  // namespace hyperparallel::comm
