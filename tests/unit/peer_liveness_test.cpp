// The heartbeat watchdog in one process: several PeerLiveness objects stand for ranks on one
// store. A rank that never beats is named after the timeout, a rank that ends cleanly is not
// mistaken for a dead one, a store that goes away is reported as such, and heartbeat keys a
// stray client overwrites do not make anyone look dead.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/peer_liveness.h"
#include "comm/socket_store.h"

namespace hyperparallel {
namespace {

using namespace std::chrono_literals;
using comm::PeerLiveness;
using Clock = std::chrono::steady_clock;

constexpr auto kInterval = 100ms;

// What the watchdog reported, and when.
struct Verdict {
  std::mutex mutex;
  std::string message;
  Clock::time_point when;
  std::atomic<int> calls{0};

  PeerLiveness::OnLost recorder() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(mutex);
      message = m;
      when = Clock::now();
      ++calls;
    };
  }
  bool wait(std::chrono::milliseconds limit) {
    for (auto end = Clock::now() + limit; Clock::now() < end; std::this_thread::sleep_for(10ms)) {
      if (calls > 0) return true;
    }
    return calls > 0;
  }
};

struct Store {
  std::unique_ptr<comm::StoreServer> server;
  int port = 0;
  Store() : server(std::make_unique<comm::StoreServer>("127.0.0.1", 0)), port(server->port()) {}
  std::unique_ptr<PeerLiveness> rank(int r) const {
    return std::make_unique<PeerLiveness>(c10::make_intrusive<comm::SocketStore>("127.0.0.1", port, 5000ms),
                                          "127.0.0.1:" + std::to_string(port), r, kInterval);
  }
};

TEST(PeerLiveness, ARankThatNeverBeatsIsNamedAfterTheTimeout) {
  Store store;
  auto rank0 = store.rank(0);
  auto rank1 = store.rank(1);  // rank 2 never starts: its counter never moves
  Verdict verdict;
  const auto start = Clock::now();
  rank0->watch({0, 1, 2}, 600ms, verdict.recorder());
  ASSERT_TRUE(verdict.wait(5000ms));
  EXPECT_EQ(verdict.message, "rank 2 stopped responding (no heartbeat for 0.6 s)");
  const auto waited = verdict.when - start;
  EXPECT_GE(waited, 600ms);
  EXPECT_LT(waited, 2000ms);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(verdict.calls, 1) << "the watchdog reports once";
}

TEST(PeerLiveness, ARankThatEndsCleanlyIsNotMistakenForADeadOne) {
  Store store;
  auto rank0 = store.rank(0);
  auto rank1 = store.rank(1);
  auto rank2 = store.rank(2);
  Verdict verdict;
  rank0->watch({0, 1, 2}, 500ms, verdict.recorder());
  std::this_thread::sleep_for(300ms);
  rank1.reset();  // ends cleanly: marks itself finished
  EXPECT_FALSE(verdict.wait(1500ms)) << verdict.message;
  EXPECT_EQ(rank0->describe_unresponsive({0, 1, 2}), "rank 1 had already ended");
}

TEST(PeerLiveness, AStoreThatGoesAwayIsReported) {
  Store store;
  auto rank0 = store.rank(0);
  auto rank1 = store.rank(1);
  Verdict verdict;
  rank1->watch({0, 1}, 500ms, verdict.recorder());
  std::this_thread::sleep_for(300ms);
  store.server.reset();  // rank 0's host ends: every store request now fails
  ASSERT_TRUE(verdict.wait(3000ms));
  EXPECT_EQ(verdict.message, "the rendezvous store at 127.0.0.1:" + std::to_string(store.port) +
                                 " has not answered for 0.5 s: rank 0's host is down or cannot be reached");
  EXPECT_EQ(rank1->describe_unresponsive({0, 1}),
            "the rendezvous store at 127.0.0.1:" + std::to_string(store.port) + " cannot be reached: rank 0's host has stopped");
}

TEST(PeerLiveness, EveryoneAliveMeansNoVerdict) {
  Store store;
  auto rank0 = store.rank(0);
  auto rank1 = store.rank(1);
  Verdict verdict;
  rank0->watch({0, 1}, 400ms, verdict.recorder());
  EXPECT_FALSE(verdict.wait(1500ms)) << verdict.message;
  EXPECT_EQ(rank0->describe_unresponsive({0, 1}), "");
}

// A stray client writes text into the heartbeat counters (the store then refuses their adds):
// the store is up and every rank alive, so the watchdog names nobody, and the counters recover.
TEST(PeerLiveness, HeartbeatKeysOverwrittenWithTextAreNotMistakenForDeath) {
  Store store;
  auto rank0 = store.rank(0);
  auto rank1 = store.rank(1);
  Verdict verdict;
  rank0->watch({0, 1}, 500ms, verdict.recorder());
  comm::SocketStore stray("127.0.0.1", store.port, 5000ms);
  const std::vector<uint8_t> text = {'n', 'o', 'p', 'e'};
  for (auto end = Clock::now() + 1500ms; Clock::now() < end; std::this_thread::sleep_for(30ms)) {
    stray.set("hp/alive/0", text);
    stray.set("hp/alive/1", text);
  }
  EXPECT_FALSE(verdict.wait(800ms)) << verdict.message;
  EXPECT_EQ(rank0->describe_unresponsive({0, 1}), "");
}

}  // namespace
}  // namespace hyperparallel
