// Heartbeats in the store and the verdict after a failed collective. See peer_liveness.h.
#include "peer_liveness.h"

namespace hyperparallel::comm {
namespace {
std::string key_of(int rank) { return "hp/alive/" + std::to_string(rank); }
}  // namespace

PeerLiveness::PeerLiveness(c10::intrusive_ptr<c10d::Store> store, std::string store_address, int rank,
                           std::chrono::milliseconds interval)
    : store_(std::move(store)), store_address_(std::move(store_address)), rank_(rank), interval_(interval) {
  store_->add(key_of(rank_), 1);
  thread_ = std::thread([this] { beat(); });
}

PeerLiveness::~PeerLiveness() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
}

void PeerLiveness::beat() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_cv_.wait_for(lock, interval_, [this] { return stop_; })) {
    try {
      store_->add(key_of(rank_), 1);
    } catch (const std::exception&) {
      // The store is gone (rank 0's host ended); the next collective reports it.
    }
  }
}

int64_t PeerLiveness::count_of(int rank) const { return store_->add(key_of(rank), 0); }

std::string PeerLiveness::describe_unresponsive(const std::vector<int>& world_ranks) const {
  std::vector<int> others;
  for (int r : world_ranks) {
    if (r != rank_) others.push_back(r);
  }
  try {
    std::vector<int64_t> before;
    for (int r : others) before.push_back(count_of(r));
    std::this_thread::sleep_for(3 * interval_);
    std::string dead;
    for (size_t i = 0; i < others.size(); ++i) {
      if (count_of(others[i]) == before[i]) dead += (dead.empty() ? "rank " : ", rank ") + std::to_string(others[i]);
    }
    if (dead.empty()) return "";
    const auto seconds = std::chrono::duration_cast<std::chrono::milliseconds>(3 * interval_).count() / 1000.0;
    char text[64];
    std::snprintf(text, sizeof(text), "%.0f", seconds);
    return dead + " stopped responding (no heartbeat for " + text + " s)";
  } catch (const std::exception&) {
    return "the rendezvous store at " + store_address_ + " cannot be reached: rank 0's host has stopped";
  }
}

}  // namespace hyperparallel::comm
