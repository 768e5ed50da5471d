// GroupRegistry: makes c10d groups for sets of world ranks and caches them.
//
// One registry per world (made by init_process_group), shared by every Communicator of that
// world. A group's store keys live under "hp/group/<ranks>/<generation>": only the members
// rendezvous, and a group created again after the last holder dropped it gets a fresh
// generation so it never reads the previous group's keys. Members must create groups in the
// same order (as with c10d's new_group), which SPMD programs do. Creation ends with a barrier
// over the new group, so no member can drop it (closing its sockets) while another is still
// connecting.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hyperparallel/comm/communicator.h"
#include "peer_liveness.h"

namespace hyperparallel::comm {

class GroupRegistry : public std::enable_shared_from_this<GroupRegistry> {
 public:
  GroupRegistry(c10::intrusive_ptr<c10d::Store> store,
                std::shared_ptr<::gloo::transport::Device> device, int world_rank, int world_size,
                CommOptions options, std::shared_ptr<void> keep_alive = nullptr);

  // The Communicator for `global_ranks` (in that order), created on first use.
  std::shared_ptr<Communicator> get_or_create(const std::vector<int>& global_ranks,
                                              const std::string& name);

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  // Heartbeats of a multi-process world (null for one process); set once by init_process_group.
  void set_liveness(std::shared_ptr<PeerLiveness> liveness) { liveness_ = std::move(liveness); }
  const std::shared_ptr<PeerLiveness>& liveness() const { return liveness_; }

 private:
  struct Entry {
    std::weak_ptr<Communicator> comm;
    int generation = 0;
  };

  c10::intrusive_ptr<c10d::Store> store_;
  std::shared_ptr<::gloo::transport::Device> device_;
  int world_rank_;
  int world_size_;
  CommOptions options_;
  std::shared_ptr<void> keep_alive_;  // rank 0's store server lives as long as the world
  std::shared_ptr<PeerLiveness> liveness_;
  std::mutex mutex_;
  std::map<std::vector<int>, Entry> groups_;
};

}  // namespace hyperparallel::comm
