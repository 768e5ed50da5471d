// Heartbeats in the store, the watchdog, and the verdict after a failed collective. See
// peer_liveness.h.
#include "peer_liveness.h"

#include <cstdio>

#include "socket_store.h"

namespace hyperparallel::comm {
namespace {

std::string key_of(int rank) { return "hp/alive/" + std::to_string(rank); }

// Added to a counter when its rank ends cleanly: a negative count means "finished".
constexpr int64_t kFinishedMark = -(int64_t{1} << 40);

std::string seconds_text(std::chrono::milliseconds d) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", static_cast<double>(d.count()) / 1000.0);
  return text;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "rank " : ", rank ") + std::to_string(r);
  return text;
}

std::string silent_for(const std::vector<int>& ranks, std::chrono::milliseconds d) {
  return rank_list(ranks) + " stopped responding (no heartbeat for " + seconds_text(d) + " s)";
}

}  // namespace

PeerLiveness::PeerLiveness(c10::intrusive_ptr<SocketStore> store, std::string store_address, int rank,
                           std::chrono::milliseconds interval)
    : store_(std::move(store)), store_address_(std::move(store_address)), rank_(rank), interval_(interval) {
  beat_own_counter();  // the first beat already survives a stray writer on the key
  store_answered_ = Clock::now();
  beat_thread_ = std::thread([this] { beat(); });
}

PeerLiveness::~PeerLiveness() {
  std::unique_lock<std::mutex> lock(mutex_);
  stop_ = true;
  changed_.notify_all();
  // The heartbeat thread may be stuck on a store that vanished without closing the
  // connection; give it a moment to mark this rank finished, then cut the connection.
  if (!changed_.wait_for(lock, 2 * interval_, [this] { return beat_ended_; })) store_->interrupt();
  lock.unlock();
  beat_thread_.join();
  if (judge_thread_.joinable()) judge_thread_.join();
}

void PeerLiveness::watch(const std::vector<int>& world_ranks, std::chrono::milliseconds timeout, OnLost on_lost) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  for (int r : world_ranks) {
    if (r != rank_) watched_.push_back({r, 0, now});
  }
  timeout_ = timeout;
  on_lost_ = std::move(on_lost);
  store_answered_ = now;
  judge_thread_ = std::thread([this] { judge(); });
}

void PeerLiveness::beat() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!changed_.wait_for(lock, interval_, [this] { return stop_; })) {
    std::vector<int> ranks;
    std::vector<int64_t> previous;
    for (const auto& w : watched_) ranks.push_back(w.rank), previous.push_back(w.count);
    lock.unlock();
    std::vector<int64_t> counts;
    bool answered = true;
    try {
      beat_own_counter();
      for (size_t i = 0; i < ranks.size(); ++i) counts.push_back(count_or(ranks[i], previous[i]));
    } catch (const std::exception&) {
      answered = false;  // the store is gone; the watchdog or the next collective reports it
    }
    lock.lock();
    if (!answered) continue;
    const auto now = Clock::now();
    store_answered_ = now;
    for (size_t i = 0; i < counts.size() && i < watched_.size(); ++i) {
      Watched& w = watched_[i];
      if (counts[i] != w.count) w.moved = now;
      w.count = counts[i];
    }
  }
  lock.unlock();
  try {
    store_->add(key_of(rank_), kFinishedMark);
  } catch (const std::exception&) {
  }
  lock.lock();
  beat_ended_ = true;
  changed_.notify_all();
}

void PeerLiveness::judge() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!changed_.wait_for(lock, interval_, [this] { return stop_; })) {
    const auto now = Clock::now();
    std::string message;
    if (now - store_answered_ > timeout_) {
      message = "the rendezvous store at " + store_address_ + " has not answered for " + seconds_text(timeout_) +
                " s: rank 0's host is down or cannot be reached";
    } else if (now - store_answered_ <= 2 * interval_) {
      // Counters are news only while the store answers: when it has just stopped, rank 0's
      // host is the suspect, not the ranks whose counters it can no longer show moving.
      std::vector<int> silent;
      for (const auto& w : watched_) {
        if (w.count >= 0 && now - w.moved > timeout_) silent.push_back(w.rank);
      }
      if (!silent.empty()) message = silent_for(silent, timeout_);
    }
    if (message.empty()) continue;
    OnLost on_lost = on_lost_;
    lock.unlock();
    on_lost(message);
    return;
  }
}

int64_t PeerLiveness::count_of(int rank) const { return store_->add(key_of(rank), 0); }

// The store refuses an add when something else wrote a non-number into a counter key; it is
// up, so that is no sign of a dead host. This rank's own counter is written afresh (a jump,
// which its watchers read as a beat). A peer's counter that cannot be read counts as moved:
// the store answers and something is writing that key (a dead rank's key is not written), so
// a stray writer cannot make the watchdog name a live rank or host as dead.
void PeerLiveness::beat_own_counter() {
  try {
    store_->add(key_of(rank_), 1);
  } catch (const StoreRefused&) {
    const std::string fresh = std::to_string(++own_resets_ * 1'000'000'000LL);
    store_->set(key_of(rank_), std::vector<uint8_t>(fresh.begin(), fresh.end()));
  }
}

int64_t PeerLiveness::count_or(int rank, int64_t last) const {
  try {
    return count_of(rank);
  } catch (const StoreRefused&) {
    return last >= 0 ? last + 1 : last;
  }
}

std::string PeerLiveness::describe_unresponsive(const std::vector<int>& world_ranks) const {
  std::vector<int> others;
  for (int r : world_ranks) {
    if (r != rank_) others.push_back(r);
  }
  try {
    std::vector<int64_t> before;
    std::vector<int> ended_before;
    for (int r : others) {
      before.push_back(count_or(r, 0));
      if (before.back() < 0) ended_before.push_back(r);
    }
    // A member that has left the job is the answer; do not wait (the launcher may stop the
    // store's host meanwhile).
    if (!ended_before.empty()) return rank_list(ended_before) + " had already ended";
    std::this_thread::sleep_for(3 * interval_);
    std::vector<int> silent, ended;
    for (size_t i = 0; i < others.size(); ++i) {
      const int64_t now = count_or(others[i], before[i]);
      if (now < 0) {
        ended.push_back(others[i]);
      } else if (now == before[i]) {
        silent.push_back(others[i]);
      }
    }
    std::string text;
    if (!silent.empty()) text = silent_for(silent, 3 * interval_);
    if (!ended.empty()) text += (text.empty() ? "" : "; ") + rank_list(ended) + " had already ended";
    return text;
  } catch (const std::exception&) {
    return "the rendezvous store at " + store_address_ + " cannot be reached: rank 0's host has stopped";
  }
}

}  // namespace hyperparallel::comm
