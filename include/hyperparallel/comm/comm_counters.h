// CommCounters: calls and bytes on the wire per collective kind, per communicator.
//
// "Bytes on the wire" is what this rank sends under the standard algorithm for the
// collective on a group of N ranks (docs/comm.md "Counters" has the table):
//   all-gather of S bytes in      (N-1)·S          (ring)
//   reduce-scatter to S bytes out (N-1)·S          (all-to-all; the same as a ring)
//   all-reduce of S bytes         2·(N-1)·ceil(S/N) (ring: reduce-scatter + all-gather)
//   broadcast of S bytes          root (N-1)·S, others 0
//   all-to-all                    the bytes of the splits sent to other ranks
//   send / recv                   the bytes sent / received
// Counting happens when a collective is issued, so tests and benchmarks can check the
// communication a step performs against theory.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace hyperparallel::comm {

enum class CollectiveKind : int {
  kAllGather = 0,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kAllToAll,
  kSend,
  kRecv,
  kBarrier,
};
inline constexpr int kNumCollectiveKinds = 8;

const char* to_string(CollectiveKind kind);

struct CollectiveCount {
  int64_t calls = 0;
  int64_t bytes = 0;
};

class CommCounters {
 public:
  void record(CollectiveKind kind, int64_t bytes);
  const CollectiveCount& operator[](CollectiveKind kind) const;
  int64_t total_calls() const;
  int64_t total_bytes() const;
  // Element-wise difference, for "what did this step do": after - before.
  CommCounters operator-(const CommCounters& before) const;
  // One line per kind with a non-zero count: "all_gather calls=3 bytes=1024".
  std::string to_string() const;

 private:
  std::array<CollectiveCount, kNumCollectiveKinds> counts_{};
};

}  // namespace hyperparallel::comm
