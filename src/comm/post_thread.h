// PostThread: posts a communicator's point-to-point transfers to Gloo on a thread of its own,
// in the order they were queued, so the caller returns at once and goes on computing.
//
// Why: Gloo's send and recv are not cheap to call. A send writes what the socket takes on the
// calling thread, and both take the peer pair's lock, which Gloo's I/O thread holds while it
// moves the bytes of earlier transfers. In a 2-rank FSDP step the training thread spent 86 ms
// of 563 in gloo:send / gloo:recv (LibTorch's profiler, docs/benchmarks.md "Posting transfers
// off the training thread"). Gloo's collectives are queued to its own workers already; only
// point-to-point calls ran on the caller.
//
// Invariants: one thread per communicator, started by the first post; FIFO, so every rank
// posts its transfers in program order (their tags are drawn by the caller, in program order,
// before posting). The destructor posts what is queued, then joins: the owner (the
// communicator) destroys it before the process group it posts to.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace hyperparallel::comm {

class PostThread {
 public:
  using Works = std::vector<c10::intrusive_ptr<c10d::Work>>;

  PostThread() = default;
  PostThread(const PostThread&) = delete;
  PostThread& operator=(const PostThread&) = delete;
  ~PostThread();

  // Runs `post` on the thread after everything queued before it; its works, or the exception
  // it threw, arrive through the future.
  std::shared_future<Works> post(std::function<Works()> post);

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<std::packaged_task<Works()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace hyperparallel::comm
