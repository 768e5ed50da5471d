#include "hyperparallel/comm/comm_counters.h"

#include <sstream>

namespace hyperparallel::comm {

const char* to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kAllToAll: return "all_to_all";
    case CollectiveKind::kSend: return "send";
    case CollectiveKind::kRecv: return "recv";
    case CollectiveKind::kBarrier: return "barrier";
  }
  return "unknown";
}

void CommCounters::record(CollectiveKind kind, int64_t bytes) {
  auto& c = counts_[static_cast<int>(kind)];
  c.calls += 1;
  c.bytes += bytes;
}

const CollectiveCount& CommCounters::operator[](CollectiveKind kind) const {
  return counts_[static_cast<int>(kind)];
}

int64_t CommCounters::total_calls() const {
  int64_t n = 0;
  for (const auto& c : counts_) n += c.calls;
  return n;
}

int64_t CommCounters::total_bytes() const {
  int64_t n = 0;
  for (const auto& c : counts_) n += c.bytes;
  return n;
}

CommCounters CommCounters::operator-(const CommCounters& before) const {
  CommCounters diff;
  for (int i = 0; i < kNumCollectiveKinds; ++i) {
    diff.counts_[i].calls = counts_[i].calls - before.counts_[i].calls;
    diff.counts_[i].bytes = counts_[i].bytes - before.counts_[i].bytes;
  }
  return diff;
}

std::string CommCounters::to_string() const {
  std::ostringstream out;
  for (int i = 0; i < kNumCollectiveKinds; ++i) {
    if (counts_[i].calls == 0) continue;
    out << hyperparallel::comm::to_string(static_cast<CollectiveKind>(i)) << " calls=" << counts_[i].calls
        << " bytes=" << counts_[i].bytes << "\n";
  }
  return out.str();
}

}  // namespace hyperparallel::comm
