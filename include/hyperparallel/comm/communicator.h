// Communicator: one process group (a set of ranks) and the collectives the library needs,
// all asynchronous, over c10d (Gloo on CPU).
//
// What it adds to c10d's Gloo backend (docs/comm.md has the details and the reasons):
//  - flat all-gather into one output buffer, and reduce-scatter from one flat input, which
//    Gloo lacks: an all-to-all followed by a local reduction in rank order — the same bytes
//    on the wire as a ring, and the same result bits on every rank;
//  - AVG for all-reduce and reduce-scatter;
//  - any dtype on the wire: data moves as bytes, so bf16/fp16/bool/int16 work; reductions
//    of bf16/fp16 accumulate in fp32 and cast once (a bf16 sum equals the fp32 sum cast);
//  - argument and dtype checks before anything is issued (Gloo reports some errors late and
//    then the group is unusable);
//  - counters of calls and bytes on the wire per kind (comm_counters.h).
// Ownership: a Communicator owns its c10d group. All groups made from one world share one
// GroupRegistry (a store plus a cache), so asking twice for the same ranks returns the same
// Communicator. There is no global default group: pass communicators explicitly.
// Thread safety: issue collectives from one thread at a time per communicator, in the same
// order on every member rank (as with any c10d group); counters are safe to read anytime.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hyperparallel/comm/comm_counters.h"
#include "hyperparallel/comm/comm_handle.h"

namespace hyperparallel::platform {
class TraceRecorder;
class FaultInjector;
}

namespace hyperparallel::comm {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
const char* to_string(ReduceOp op);

struct CommOptions {
  // Limit for one collective; past it the collective fails with CommError.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Limit for reaching the rendezvous store and for group creation.
  std::chrono::milliseconds rendezvous_timeout{std::chrono::seconds(120)};
  // Watchdog (multi-process worlds): when a rank's heartbeat in the store stops for this
  // long, or the store stops answering, on_peer_lost runs — also while this rank is blocked
  // inside a collective. 0 = no watchdog (docs/comm.md "Liveness").
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(30)};
  // Gets the sentence naming the lost rank(s). Empty: print it to stderr and end the process
  // with exit code 1 — a collective blocked on a vanished peer cannot be cancelled otherwise.
  std::function<void(const std::string& message)> on_peer_lost;
  // Testing aid: sleep a random 0..N ms (seeded by the world rank) before issuing each
  // collective, to expose races between ranks. 0 = off.
  int inject_delay_max_ms = 0;
  // Testing aid: fail one rank at a chosen collective or checkpoint step (fault_injection.h).
  std::shared_ptr<platform::FaultInjector> faults;
};

class GroupRegistry;  // src/comm/group_registry.h

class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  struct Impl;  // holds the c10d group; defined in src/comm/communicator_impl.h
  explicit Communicator(std::unique_ptr<Impl> impl);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;                             // this process's rank within the group
  int size() const;                             // number of ranks in the group
  const std::string& name() const;              // for messages: "world", "dp_shard", ...
  const std::vector<int>& global_ranks() const; // the members as world ranks, in group order
  int global_rank() const;                      // this process's world rank
  const CommOptions& options() const;

  // output.numel() == size() * input.numel(); rank r's input lands at [r*n, (r+1)*n).
  CommHandle all_gather(const at::Tensor& output, const at::Tensor& input);
  // input.numel() == size() * output.numel(); output = op over ranks of input[rank*n, ...).
  CommHandle reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                            ReduceOp op = ReduceOp::kSum);
  CommHandle all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);

  // Blocked layout, for sharding several tensors in one collective: `unsharded` holds, for
  // each block k in order, size() consecutive pieces of block_numels[k] elements (piece r
  // belongs to rank r); `shard` holds this rank's pieces of every block back to back. So each
  // tensor is contiguous in `unsharded` and views of it need no copy-out. One block is the
  // plain all_gather / reduce_scatter. Bytes on the wire are those of a ring.
  CommHandle all_gather_blocks(const at::Tensor& unsharded, const at::Tensor& shard,
                               const std::vector<int64_t>& block_numels);
  CommHandle reduce_scatter_blocks(const at::Tensor& shard, const at::Tensor& unsharded,
                                   const std::vector<int64_t>& block_numels, ReduceOp op = ReduceOp::kSum);
  CommHandle broadcast(const at::Tensor& tensor, int root);
  // Splits are counts of dim-0 rows per rank; empty splits mean equal parts.
  CommHandle all_to_all(const at::Tensor& output, const at::Tensor& input,
                        const std::vector<int64_t>& output_splits = {},
                        const std::vector<int64_t>& input_splits = {});
  CommHandle send(const at::Tensor& tensor, int dst, int tag = 0);
  CommHandle recv(const at::Tensor& tensor, int src, int tag = 0);
  CommHandle barrier();

  // The group of `global_ranks` (world ranks, in the order given); this process must be
  // one of them and every member must ask for it in the same program order. Cached: a
  // second request for the same ranks returns the same Communicator.
  std::shared_ptr<Communicator> group(const std::vector<int>& global_ranks, const std::string& name);

  CommCounters counters() const;
  void reset_counters();
  // Total time callers have spent blocked in wait() on this communicator's handles: the
  // communication that computation did not hide.
  double wait_seconds() const;
  // Record every collective's span (issue to completion seen in wait()) and the time blocked
  // in wait(); null stops recording.
  void set_trace(std::shared_ptr<platform::TraceRecorder> trace);

  Impl& impl() { return *impl_; }  // for src/comm only

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyperparallel::comm
