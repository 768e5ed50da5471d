// Communicator::Impl and PendingWork implementations: the only place that holds c10d types.
// Version-specific c10d calls stay in src/comm/ so the rest of the library builds against
// other LibTorch versions by changing this directory alone.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <functional>
#include <mutex>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/platform/trace.h"
#include "post_thread.h"
#include "scratch_pool.h"

namespace hyperparallel::comm {

class GroupRegistry;
class WirePendingWork;

// Composite collectives whose finishing step uses the wire (the all-gather phase of a bf16 /
// fp16 all-reduce) run those steps in issue order on every rank, whatever order the caller
// waits in: waiting for one first completes every earlier such collective of the same
// communicator. Without this, two ranks waiting in different orders would each block in a
// different collective's second phase (docs/comm.md "Composite collectives").
class OrderedFinishes {
 public:
  void enqueue(WirePendingWork* work);
  void remove(WirePendingWork* work);  // a work that completed or was dropped
  // Completes, in issue order, every queued work before `work`; `work` itself stays queued.
  void complete_before(WirePendingWork* work, std::optional<std::chrono::milliseconds> timeout);

 private:
  std::vector<WirePendingWork*> queue_;  // issue order
};

struct Communicator::Impl {
  // The Gloo backend itself: c10d::ProcessGroup in 2.x only dispatches to it through the op
  // registry, which adds nothing for a CPU group.
  c10::intrusive_ptr<c10d::Backend> group;
  std::shared_ptr<GroupRegistry> registry;
  std::vector<int> global_ranks;
  int rank = 0;
  std::string name;
  CommOptions options;
  mutable std::mutex counters_mutex;
  CommCounters counters;
  std::shared_ptr<ScratchPool> scratch = std::make_shared<ScratchPool>();
  // Tags of the point-to-point exchanges that all_gather is made of; user send/recv tags
  // stay below kInternalTagBase. Advances identically on every rank (SPMD order).
  static constexpr int kInternalTagBase = 1 << 30;
  uint32_t internal_p2p_seq = 0;
  std::shared_ptr<OrderedFinishes> ordered_finishes = std::make_shared<OrderedFinishes>();
  uint64_t delay_rng_state = 0;  // for options.inject_delay_max_ms
  // Time callers spent blocked in wait() on this communicator's handles ("exposed" time).
  std::shared_ptr<std::atomic<int64_t>> wait_ns = std::make_shared<std::atomic<int64_t>>(0);
  std::shared_ptr<platform::TraceRecorder> trace;  // null: not tracing
  // Last member: destroyed (drained and joined) first, while the group it posts to lives.
  PostThread post_thread;
};

// Waits for c10d Works (one collective, or the sends and receives of a point-to-point
// exchange), then runs `finish` (local steps of a composite collective). Failures become
// CommError naming the collective and the group.
class WirePendingWork : public PendingWork {
 public:
  // `diagnose` runs when the collective fails and returns what to add to the error (which
  // peers stopped responding), or "".
  WirePendingWork(std::vector<c10::intrusive_ptr<c10d::Work>> works, std::function<void()> finish,
                  std::string what, std::chrono::milliseconds default_timeout,
                  std::shared_ptr<std::atomic<int64_t>> wait_ns, std::shared_ptr<platform::TraceRecorder> trace,
                  std::function<std::string()> diagnose);
  ~WirePendingWork() override;
  void wait(std::optional<std::chrono::milliseconds> timeout) override;
  bool is_completed() override;
  // Makes this work's finishing step run in issue order among the communicator's other
  // wire-using finishes (OrderedFinishes).
  void order_finish_in(std::shared_ptr<OrderedFinishes> order);
  // wait() without the ordering step; OrderedFinishes calls it for earlier works, after
  // leave_order() (they are out of the queue: their own wait() must not drain it again).
  void complete(std::optional<std::chrono::milliseconds> timeout);
  void leave_order() { order_ = nullptr; }
  // The works are being posted on the communicator's PostThread: wait for them there first.
  void set_posted(std::shared_future<PostThread::Works> posted) { posted_ = std::move(posted); }

 private:
  std::shared_ptr<OrderedFinishes> order_;  // null: the finish is local only
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::shared_future<PostThread::Works> posted_;  // invalid: works_ were issued by the caller
  std::function<void()> finish_;
  std::string what_;
  std::chrono::milliseconds default_timeout_;
  std::shared_ptr<std::atomic<int64_t>> wait_ns_;
  std::shared_ptr<platform::TraceRecorder> trace_;
  std::function<std::string()> diagnose_;
  platform::TraceRecorder::Clock::time_point issued_ = platform::TraceRecorder::Clock::now();
};

// Waits for a c10d Work in the calling thread with a readable error; for finishing steps.
void wait_work(const c10::intrusive_ptr<c10d::Work>& work, std::chrono::milliseconds timeout,
               const std::string& what);

}  // namespace hyperparallel::comm
