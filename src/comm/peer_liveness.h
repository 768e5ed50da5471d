// PeerLiveness: which ranks are still alive — a watchdog that stops this rank when a peer
// or the store goes silent, and the culprit's name when a collective fails.
//
// Every rank of a multi-process world runs a heartbeat thread that increments its counter
// "hp/alive/<rank>" in the rendezvous store every `interval`, over a store connection of its
// own (so a long blocking store wait elsewhere never stalls it). Counters, not timestamps, so
// machines' clocks need not agree. A rank that ends cleanly marks its counter finished
// (negative), so a peer that outlives it never mistakes it for a dead one.
//
// Watchdog (watch()): the heartbeat thread also reads the watched ranks' counters each
// interval and records when each last moved, and when the store last answered at all; a
// second thread judges. When a rank's counter has not moved for `timeout`, or the store has
// not answered for `timeout` (rank 0's host is gone, or the network to it), `on_lost` gets a
// sentence naming it. This is what catches a peer that vanished without closing its sockets
// (power loss, partition, a frozen process): Gloo would wait for it until the collective
// timeout. The judge runs outside the collectives, so it fires even while this rank is
// blocked inside one. Cost: each rank reads every watched counter each interval (N store
// round trips per second per rank).
//
// After a failed collective, describe_unresponsive() compares counters over 3 intervals and
// names the ranks whose counters did not move (or that had already ended).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "socket_store.h"

namespace hyperparallel::comm {

class PeerLiveness {
 public:
  using OnLost = std::function<void(const std::string& message)>;

  PeerLiveness(c10::intrusive_ptr<SocketStore> store, std::string store_address, int rank,
               std::chrono::milliseconds interval = std::chrono::milliseconds(1000));
  ~PeerLiveness();  // marks this rank finished in the store (when it can be reached)
  PeerLiveness(const PeerLiveness&) = delete;
  PeerLiveness& operator=(const PeerLiveness&) = delete;

  // Starts the watchdog over `world_ranks` (this rank excluded); call once, after every rank
  // has joined. `on_lost` is called at most once, from the watchdog thread.
  void watch(const std::vector<int>& world_ranks, std::chrono::milliseconds timeout, OnLost on_lost);

  // "" when every rank of `world_ranks` (other than this one) is alive; otherwise a sentence
  // naming those that stopped or ended, or saying the store is unreachable. Blocks ~3 intervals.
  std::string describe_unresponsive(const std::vector<int>& world_ranks) const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Watched {
    int rank = 0;
    int64_t count = 0;  // negative: the rank ended cleanly
    Clock::time_point moved;
  };

  void beat();   // heartbeat thread: own counter up, watched counters read
  void judge();  // watchdog thread: decides when someone has been silent too long
  int64_t count_of(int rank) const;  // throws when the store cannot be reached
  void beat_own_counter();
  int64_t count_or(int rank, int64_t last) const;  // moved past `last` when the store refuses the read

  c10::intrusive_ptr<SocketStore> store_;
  std::string store_address_;
  int rank_;
  std::chrono::milliseconds interval_;

  std::mutex mutex_;  // guards everything below
  std::condition_variable changed_;
  bool stop_ = false;
  int64_t own_resets_ = 0;  // times this rank rewrote its corrupted counter (constructor, then the beat thread only)
  bool beat_ended_ = false;
  std::vector<Watched> watched_;
  Clock::time_point store_answered_;
  std::chrono::milliseconds timeout_{0};
  OnLost on_lost_;
  std::thread beat_thread_;
  std::thread judge_thread_;
};

}  // namespace hyperparallel::comm
