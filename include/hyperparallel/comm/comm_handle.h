// CommHandle: a move-only handle on one asynchronous collective.
//
// Every Communicator call returns at once with a CommHandle; wait() blocks until the
// result is in the caller's output tensor (or throws CommError). Some collectives are
// composites (reduce-scatter = all-to-all + a local reduction in rank order; a bf16
// all-reduce = that, then an all-gather): their wire phase runs asynchronously and their
// finishing steps run inside wait(). Ranks may wait() in different orders: tags are drawn at
// issue, and finishing steps that use the wire run in issue order (waiting for one handle
// first completes the communicator's earlier ones). A handle dropped without wait() lets
// the wire transfer finish (the backend keeps the buffers alive) but skips the finishing
// steps; the destructor never blocks and never throws.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

namespace hyperparallel::comm {

// A collective failed: a timeout, a peer that went away, a transport error.
class CommError : public std::runtime_error {
 public:
  explicit CommError(const std::string& message) : std::runtime_error(message) {}
};

// The in-flight part of a collective. Implementations live in src/comm/.
class PendingWork {
 public:
  virtual ~PendingWork() = default;
  // Blocks until the result is complete. nullopt = the communicator's own timeout.
  virtual void wait(std::optional<std::chrono::milliseconds> timeout) = 0;
  // True when wait() would not block on the wire (finishing steps may still run in wait()).
  virtual bool is_completed() = 0;
};

class CommHandle {
 public:
  CommHandle() = default;  // an already-completed handle
  explicit CommHandle(std::unique_ptr<PendingWork> work);
  CommHandle(CommHandle&&) noexcept;
  CommHandle& operator=(CommHandle&&) noexcept;
  CommHandle(const CommHandle&) = delete;
  CommHandle& operator=(const CommHandle&) = delete;
  ~CommHandle();

  // Blocks until done; throws CommError on failure or when `timeout` passes first.
  // Waiting twice is allowed and returns at once the second time.
  void wait(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  bool is_completed() const;
  bool pending() const { return work_ != nullptr; }

 private:
  std::unique_ptr<PendingWork> work_;
};

}  // namespace hyperparallel::comm
