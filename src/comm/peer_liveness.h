// PeerLiveness: which ranks are still alive, for naming the culprit when a collective fails.
//
// Every rank of a multi-process world runs one heartbeat thread that increments its counter
// "hp/alive/<rank>" in the rendezvous store every `interval`, over a store connection of its
// own (so a long blocking store wait elsewhere never stalls it). When a collective fails — a
// peer closed its connection, or the timeout passed — the failing rank reads the counters of
// the group's ranks, waits a few intervals and reads again: ranks whose counter did not move
// have died or hung, and the error names them. Counters, not timestamps, so machines' clocks
// need not agree. If the store itself cannot be reached, rank 0's host is gone, and the
// error says so.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hyperparallel::comm {

class PeerLiveness {
 public:
  PeerLiveness(c10::intrusive_ptr<c10d::Store> store, std::string store_address, int rank,
               std::chrono::milliseconds interval = std::chrono::milliseconds(1000));
  ~PeerLiveness();
  PeerLiveness(const PeerLiveness&) = delete;
  PeerLiveness& operator=(const PeerLiveness&) = delete;

  // "" when every rank of `world_ranks` (other than this one) is alive; otherwise a sentence
  // naming those that stopped, or saying the store is unreachable. Blocks ~3 intervals.
  std::string describe_unresponsive(const std::vector<int>& world_ranks) const;

 private:
  void beat();
  int64_t count_of(int rank) const;  // throws when the store cannot be reached

  c10::intrusive_ptr<c10d::Store> store_;
  std::string store_address_;
  int rank_;
  std::chrono::milliseconds interval_;
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace hyperparallel::comm
