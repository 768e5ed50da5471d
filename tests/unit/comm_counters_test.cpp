// Counters record the theoretical bytes on the wire of every collective (comm_counters.h).
#include <gtest/gtest.h>

#include "hyperparallel/comm/communicator.h"
#include "support/multiprocess.h"

namespace hyperparallel {
namespace {

using comm::CollectiveKind;
using testing::RankContext;
using testing::run_on_ranks;

TEST(CommCounters, ArithmeticAndText) {
  comm::CommCounters a;
  a.record(CollectiveKind::kAllGather, 100);
  a.record(CollectiveKind::kAllGather, 50);
  a.record(CollectiveKind::kBarrier, 0);
  comm::CommCounters b = a;
  b.record(CollectiveKind::kReduceScatter, 30);
  const comm::CommCounters d = b - a;
  EXPECT_EQ(a[CollectiveKind::kAllGather].calls, 2);
  EXPECT_EQ(a[CollectiveKind::kAllGather].bytes, 150);
  EXPECT_EQ(d[CollectiveKind::kAllGather].calls, 0);
  EXPECT_EQ(d[CollectiveKind::kReduceScatter].calls, 1);
  EXPECT_EQ(d[CollectiveKind::kReduceScatter].bytes, 30);
  EXPECT_EQ(b.total_calls(), 4);
  EXPECT_EQ(b.total_bytes(), 180);
  EXPECT_EQ(d.to_string(), "reduce_scatter calls=1 bytes=30\n");
}

class CommCountersWire : public ::testing::TestWithParam<int> {};

TEST_P(CommCountersWire, EqualTheoreticalBytesOnTheWire) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    auto& c = *ctx.world;
    const int64_t n = c.size(), me = c.rank();
    c.reset_counters();
    // all_gather of 10 fp32 per rank: a ring sends (n-1) shards.
    c.all_gather(at::empty({n * 10}), at::ones({10})).wait();
    // reduce_scatter to 6 bf16 per rank: (n-1) shards of 12 bytes.
    c.reduce_scatter(at::empty({6}, at::kBFloat16), at::ones({n * 6}, at::kBFloat16)).wait();
    // all_reduce of 10 fp32 (native) and 10 fp16 (composite): 2 (n-1) ceil(10/n) elements.
    c.all_reduce(at::ones({10})).wait();
    c.all_reduce(at::ones({10}, at::kHalf)).wait();
    // broadcast of 8 int64 from rank 0.
    c.broadcast(at::ones({8}, at::kLong), 0).wait();
    // all_to_all sending 2 rows of 3 fp32 to every rank.
    c.all_to_all(at::empty({2 * n, 3}), at::ones({2 * n, 3})).wait();
    c.barrier().wait();
    const auto counts = c.counters();
    const int64_t shard10 = (10 + n - 1) / n;
    EXPECT_EQ(counts[CollectiveKind::kAllGather].calls, 1);
    EXPECT_EQ(counts[CollectiveKind::kAllGather].bytes, (n - 1) * 40);
    EXPECT_EQ(counts[CollectiveKind::kReduceScatter].calls, 1);
    EXPECT_EQ(counts[CollectiveKind::kReduceScatter].bytes, (n - 1) * 12);
    EXPECT_EQ(counts[CollectiveKind::kAllReduce].calls, 2);
    EXPECT_EQ(counts[CollectiveKind::kAllReduce].bytes, 2 * (n - 1) * shard10 * 4 + 2 * (n - 1) * shard10 * 2);
    EXPECT_EQ(counts[CollectiveKind::kBroadcast].calls, 1);
    EXPECT_EQ(counts[CollectiveKind::kBroadcast].bytes, me == 0 ? (n - 1) * 64 : 0);
    EXPECT_EQ(counts[CollectiveKind::kAllToAll].bytes, (n - 1) * 2 * 3 * 4);
    EXPECT_EQ(counts[CollectiveKind::kBarrier].calls, 1);
    EXPECT_EQ(counts.total_calls(), 7);
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CommCountersWire, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace
}  // namespace hyperparallel
