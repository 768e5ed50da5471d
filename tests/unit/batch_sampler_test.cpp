// The global batch order: a function of (seed, epoch) only; dp ranks split each global batch;
// the position is saved and restored.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "hyperparallel/data/batch_sampler.h"
#include "hyperparallel/platform/user_error.h"

namespace hp = hyperparallel;
using hp::data::GlobalBatchSampler;
using hp::data::SamplerPosition;

TEST(BatchSampler, OrderDependsOnlyOnSeedAndEpoch) {
  const GlobalBatchSampler a(100, 8, 42), b(100, 16, 42), c(100, 8, 43);
  const auto order = a.epoch_order(0);
  EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), 100u);
  EXPECT_EQ(*std::min_element(order.begin(), order.end()), 0);
  EXPECT_EQ(*std::max_element(order.begin(), order.end()), 99);
  EXPECT_EQ(order, b.epoch_order(0));  // the batch size (and so the world size) does not matter
  EXPECT_NE(order, a.epoch_order(1));
  EXPECT_NE(order, c.epoch_order(0));
  EXPECT_EQ(a.epoch_order(1), GlobalBatchSampler(100, 8, 42).epoch_order(1));
  // Frozen: a checkpoint taken by one build resumes on another only if this never changes.
  EXPECT_EQ(std::vector<int64_t>(order.begin(), order.begin() + 6), (std::vector<int64_t>{52, 10, 46, 61, 57, 0}));
  const GlobalBatchSampler ordered(10, 5, 1, /*shuffle=*/false);
  EXPECT_EQ(ordered.global_batch_rows({3, 1}), (std::vector<int64_t>{5, 6, 7, 8, 9}));
}

TEST(BatchSampler, RanksSplitEachGlobalBatchTheSameWayForEveryLayout) {
  const GlobalBatchSampler sampler(103, 8, 7);
  EXPECT_EQ(sampler.steps_per_epoch(), 12);  // the last 7 rows are dropped
  const auto global = sampler.global_batch_rows({0, 3});
  for (const auto& [dp, micro_batches] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 4}, {2, 2}, {4, 1}, {8, 1}, {2, 4}}) {
    std::vector<int64_t> seen;
    for (int64_t r = 0; r < dp; ++r) {
      for (int64_t m = 0; m < micro_batches; ++m) {
        const auto rows = GlobalBatchSampler::rank_micro_batch(global, r, dp, m, micro_batches);
        EXPECT_EQ(static_cast<int64_t>(rows.size()), 8 / dp / micro_batches);
        seen.insert(seen.end(), rows.begin(), rows.end());
      }
    }
    EXPECT_EQ(seen, global) << dp << "x" << micro_batches;
  }
  EXPECT_THROW(GlobalBatchSampler::rank_micro_batch(global, 0, 3, 0, 1), std::invalid_argument);
}

TEST(BatchSampler, PositionAdvancesAcrossEpochsAndRoundTrips) {
  const GlobalBatchSampler sampler(20, 4, 3);
  SamplerPosition p;
  std::set<int64_t> epoch0;
  for (int i = 0; i < 5; ++i) {
    for (int64_t row : sampler.global_batch_rows(p)) epoch0.insert(row);
    p = sampler.next(p);
  }
  EXPECT_EQ(epoch0.size(), 20u);
  EXPECT_EQ(p, (SamplerPosition{1, 0}));
  p = sampler.next(sampler.next(p));
  EXPECT_EQ(sampler.position_from_json(sampler.position_json(p)), p);
  EXPECT_THROW(GlobalBatchSampler(21, 4, 3).position_from_json(sampler.position_json(p)), hp::UserError);
  EXPECT_THROW(GlobalBatchSampler(20, 2, 3).position_from_json(sampler.position_json(p)), hp::UserError);
  EXPECT_THROW(sampler.position_from_json("{\"epoch\": 1}"), hp::UserError);
  EXPECT_THROW(GlobalBatchSampler(3, 4, 0), hp::UserError);
}
