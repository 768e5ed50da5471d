// DTensor: every redistribution pair, forward and backward, against a single-process
// reference on 1-D meshes of 2, 3 and 4 ranks (uneven and empty shards) and on a 2x2 mesh
// (nested shards of one dim), plus the shard arithmetic, the errors and the bytes on the wire.
//
// The reference: a global tensor X and a weight W, both small integers (so every sum is
// exact in any order). A rank's input is its piece of X under the source placements
// (Partial pieces: integer noise that sums — or averages — back to X). The loss is
// sum(result_local * W_piece), W_piece being W in the result's gradient placements
// (docs/dtensor.md "Gradients"), so the true gradient of X is W, and each rank's gradient
// must be its piece of W under the source's gradient placements (W/n on Partial(avg) axes).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "hyperparallel/dtensor/dtensor.h"
#include "hyperparallel/dtensor/functional_collectives.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/platform/user_error.h"
#include "support/multiprocess.h"
#include "support/tensor_data.h"

namespace hyperparallel {
namespace {

using comm::ReduceOp;
using dtensor::Box;
using dtensor::DTensor;
using dtensor::Partial;
using dtensor::Placement;
using dtensor::Placements;
using dtensor::Replicate;
using dtensor::Shard;
using testing::rank_data;
using testing::RankContext;
using testing::run_on_ranks;

at::Tensor integral(int64_t seed, at::IntArrayRef shape) { return rank_data(seed, 0, shape, at::kFloat, true); }

at::Tensor crop(const at::Tensor& t, const Box& box) {
  at::Tensor out = t;
  for (size_t d = 0; d < box.offsets.size(); ++d) out = out.narrow(static_cast<int64_t>(d), box.offsets[d], box.lengths[d]);
  return out.contiguous();
}

// This rank's input piece of `x` under `placements`: its box, then for every Partial axis
// integer noise that sums (or averages) over the axis back to the value before it.
at::Tensor piece_of(const at::Tensor& x, const mesh::DeviceMesh& mesh, const Placements& placements, int64_t seed) {
  const auto shape = x.sizes().vec();
  const Box box = dtensor::local_box(shape, placements, mesh.shape(), mesh.coordinates());
  at::Tensor value = crop(x, box);
  for (size_t axis = 0; axis < placements.size(); ++axis) {
    if (!placements[axis].is_partial()) continue;
    const int64_t n = mesh.shape()[axis], c = mesh.coordinates()[axis];
    auto noise = [&](int64_t k) { return crop(integral(seed + 10 * static_cast<int64_t>(axis) + k, shape), box); };
    at::Tensor others = at::zeros_like(value);
    for (int64_t k = 0; k < n - 1; ++k) others += noise(k);
    const bool avg = placements[axis].reduce_op() == ReduceOp::kAvg;
    value = c < n - 1 ? (avg ? value + noise(c) : noise(c)) : value - others;
  }
  return value;
}

at::Tensor expected_grad(const at::Tensor& w, const mesh::DeviceMesh& mesh, const Placements& from) {
  Placements grad = from;
  int64_t averaged_over = 1;
  for (size_t axis = 0; axis < grad.size(); ++axis) {
    if (!grad[axis].is_partial()) continue;
    if (grad[axis].reduce_op() == ReduceOp::kAvg) averaged_over *= mesh.shape()[axis];
    grad[axis] = Replicate();
  }
  at::Tensor g = crop(w, dtensor::local_box(w.sizes().vec(), grad, mesh.shape(), mesh.coordinates()));
  return averaged_over > 1 ? g / static_cast<double>(averaged_over) : g;
}

bool has_partial(const Placements& p) {
  for (const auto& x : p) {
    if (x.is_partial()) return true;
  }
  return false;
}

// One pair: forward value (exact local piece, or the reduced value for Partial targets) and
// the gradient of the input.
void check_pair(const mesh::DeviceMesh& mesh, const std::vector<int64_t>& shape, const Placements& from,
                const Placements& to) {
  const std::string what = dtensor::to_string(from) + " -> " + dtensor::to_string(to);
  const at::Tensor x = integral(1, shape), w = integral(2, shape);
  at::Tensor input = piece_of(x, mesh, from, 100).requires_grad_(true);
  DTensor source = DTensor::from_local(input, mesh, from, shape);
  DTensor result = source.redistribute(to);
  if (has_partial(to)) {
    EXPECT_TRUE(at::equal(result.full_tensor().detach(), x)) << what;
  } else {
    const Box box = dtensor::local_box(shape, to, mesh.shape(), mesh.coordinates());
    EXPECT_TRUE(at::equal(result.to_local().detach(), crop(x, box))) << what;
  }
  // The loss's own gradient by the result, in the result's gradient placements.
  const at::Tensor w_piece = expected_grad(w, mesh, to);
  (result.to_local() * w_piece).sum().backward();
  ASSERT_TRUE(input.grad().defined()) << what;
  EXPECT_TRUE(at::equal(input.grad(), expected_grad(w, mesh, from))) << what;
}

std::vector<Placement> one_axis_placements() {
  return {Shard(0), Shard(1), Replicate(), Partial(ReduceOp::kSum), Partial(ReduceOp::kAvg)};
}

TEST(DTensorLayout, CeilSplitLeavesTheLastShardsShortOrEmpty) {
  std::vector<int64_t> lengths, offsets;
  for (int64_t k = 0; k < 4; ++k) {
    lengths.push_back(dtensor::shard_length(5, 4, k));
    offsets.push_back(dtensor::shard_offset(5, 4, k));
  }
  EXPECT_EQ(lengths, (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 2, 4, 5}));
}

TEST(DTensorLayout, NestedShardsSplitInAxisOrder) {
  // [5, 7] on a (2, 2) mesh, both axes sharding dim 0: axis 0 splits 5 into 3 + 2, axis 1
  // splits each piece again.
  const Placements p{Shard(0), Shard(0)};
  EXPECT_EQ(dtensor::local_box({5, 7}, p, {2, 2}, {0, 0}), (Box{{0, 0}, {2, 7}}));
  EXPECT_EQ(dtensor::local_box({5, 7}, p, {2, 2}, {0, 1}), (Box{{2, 0}, {1, 7}}));
  EXPECT_EQ(dtensor::local_box({5, 7}, p, {2, 2}, {1, 0}), (Box{{3, 0}, {1, 7}}));
  EXPECT_EQ(dtensor::local_box({5, 7}, p, {2, 2}, {1, 1}), (Box{{4, 0}, {1, 7}}));
  const Placements q{Shard(1), Partial()};
  EXPECT_EQ(dtensor::local_box({5, 7}, q, {2, 2}, {1, 0}), (Box{{0, 4}, {5, 3}}));
}

TEST(DTensorLayout, BadPlacementsAreUserErrorsThatSayWhy) {
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { dtensor::local_box({4, 4}, {Shard(2)}, {2}, {0}); }).find("Shard(2) is out of range for a tensor of 2 dims"),
            std::string::npos);
  EXPECT_NE(message([] { dtensor::local_box({4, 4}, {Shard(0)}, {2, 2}, {0, 0}); }).find("give one placement per mesh axis"),
            std::string::npos);
  EXPECT_NE(message([] { Partial(ReduceOp::kMax); }).find("use Partial(sum) or Partial(avg)"), std::string::npos);
  EXPECT_EQ(Shard(1).to_string(), "Shard(1)");
  EXPECT_EQ(dtensor::to_string({Replicate(), Partial(ReduceOp::kAvg)}), "[Replicate(), Partial(avg)]");
}

class DTensorRedistribute : public ::testing::TestWithParam<int> {};

TEST_P(DTensorRedistribute, EveryPairOnOneAxisMatchesOneProcessForwardAndBackward) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    mesh::DeviceMesh mesh = mesh::init_device_mesh(ctx.world, "cpu", {ctx.world_size}, {"tp"});
    for (const auto& from : one_axis_placements()) {
      for (const auto& to : one_axis_placements()) check_pair(mesh, {5, 7}, {from}, {to});
    }
  });
}

TEST_P(DTensorRedistribute, WrongLocalShapesAreUserErrors) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    mesh::DeviceMesh mesh = mesh::init_device_mesh(ctx.world, "cpu", {ctx.world_size}, {"tp"});
    try {
      DTensor::from_local(at::zeros({9, 2}), mesh, {Shard(0)}, std::vector<int64_t>{5, 2});
      ADD_FAILURE() << "no error";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("the local tensor has shape [9, 2]"), std::string::npos) << e.what();
    }
  });
}

// Declaring the default gradient placements explicitly changes nothing, also for a
// Partial(avg) result (whose local gradient is G/n).
TEST_P(DTensorRedistribute, DeclaredDefaultGradientPlacementsEqualTheDefault) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    mesh::DeviceMesh mesh = mesh::init_device_mesh(ctx.world, "cpu", {ctx.world_size}, {"tp"});
    for (const Placement& to : {Partial(ReduceOp::kAvg), Partial(ReduceOp::kSum), Shard(1)}) {
      std::vector<at::Tensor> grads;
      for (bool declared : {false, true}) {
        at::Tensor x = integral(1, {4, 6}).requires_grad_(true);
        dtensor::RedistributeOptions options;
        if (declared) options.grad_placements = Placements{to.is_partial() ? Replicate() : to};
        at::Tensor y = DTensor::from_local(x, mesh, {Replicate()}).redistribute({to}, options).to_local();
        (y * integral(2, y.sizes())).sum().backward();
        grads.push_back(x.grad());
      }
      EXPECT_TRUE(at::equal(grads[0], grads[1])) << to.to_string();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DTensorRedistribute, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

// Every pair of {Shard(0), Shard(1), Replicate, Partial(sum)} x the same on a 2x2 mesh,
// including both axes sharding one dim (nested), on an uneven [5, 7].
TEST(DTensorMesh2D, EveryPairOnTwoAxesMatchesOneProcessForwardAndBackward) {
  testing::MultiProcessOptions options;
  options.time_limit = std::chrono::seconds(240);
  run_on_ranks(4, [](RankContext& ctx) {
    mesh::DeviceMesh mesh = mesh::init_device_mesh(ctx.world, "cpu", {2, 2}, {"dp", "tp"});
    const std::vector<Placement> axis = {Shard(0), Shard(1), Replicate(), Partial()};
    std::vector<Placements> specs;
    for (const auto& a : axis) {
      for (const auto& b : axis) specs.push_back({a, b});
    }
    specs.push_back({Partial(ReduceOp::kAvg), Shard(1)});
    specs.push_back({Shard(0), Partial(ReduceOp::kAvg)});
    for (const auto& from : specs) {
      for (const auto& to : specs) check_pair(mesh, {5, 7}, from, to);
    }
  }, options);
}

TEST(DTensorMesh2D, DistributeAndFullTensorRoundTrip) {
  run_on_ranks(4, [](RankContext& ctx) {
    mesh::DeviceMesh mesh = mesh::init_device_mesh(ctx.world, "cpu", {2, 2}, {"dp", "tp"});
    const at::Tensor x = integral(3, {6, 3, 5});
    for (const Placements& p : {Placements{Shard(0), Shard(2)}, Placements{Shard(2), Shard(2)}, Placements{Partial(), Shard(1)}}) {
      DTensor d = dtensor::distribute_tensor(x, mesh, p);
      EXPECT_TRUE(at::equal(d.full_tensor(), x)) << dtensor::to_string(p);
    }
  });
}

TEST(DTensorCounters, EachTransitionIsOneCollectiveWithTheBytesOfItsPaddedShards) {
  run_on_ranks(4, [](RankContext& ctx) {
    mesh::DeviceMesh mesh = mesh::init_device_mesh(ctx.world, "cpu", {4}, {"tp"});
    auto& group = *mesh.comm("tp");
    const int64_t shard_bytes = 2 * 3 * 4;  // ceil(7 / 4) = 2 rows of 3 fp32
    auto run = [&](const Placements& from, const Placements& to) {
      at::Tensor local = piece_of(integral(1, {7, 3}), mesh, from, 100).requires_grad_(true);
      group.reset_counters();
      at::Tensor out = DTensor::from_local(local, mesh, from, std::vector<int64_t>{7, 3}).redistribute(to).to_local();
      comm::CommCounters forward = group.counters();
      group.reset_counters();
      out.sum().backward();
      return std::make_pair(forward, group.counters());
    };
    auto [fwd, bwd] = run({Shard(0)}, {Replicate()});  // backward: a slice
    EXPECT_EQ(fwd.total_calls(), 1);
    EXPECT_EQ(fwd[comm::CollectiveKind::kAllGather].bytes, 3 * shard_bytes);
    EXPECT_EQ(bwd.total_calls(), 0);
    std::tie(fwd, bwd) = run({Partial()}, {Shard(0)});  // backward: an all-gather
    EXPECT_EQ(fwd[comm::CollectiveKind::kReduceScatter].calls, 1);
    EXPECT_EQ(fwd[comm::CollectiveKind::kReduceScatter].bytes, 3 * shard_bytes);
    EXPECT_EQ(bwd[comm::CollectiveKind::kAllGather].calls, 1);
    EXPECT_EQ(fwd.total_calls() + bwd.total_calls(), 2);
    std::tie(fwd, bwd) = run({Shard(0)}, {Shard(1)});
    EXPECT_EQ(fwd[comm::CollectiveKind::kAllToAll].calls, 1);
    EXPECT_EQ(bwd[comm::CollectiveKind::kAllToAll].calls, 1);
    EXPECT_EQ(fwd.total_calls() + bwd.total_calls(), 2);
  });
}

class FunctionalCollectives : public ::testing::TestWithParam<int> {};

// Each rank's loss uses its own term W_r of W = sum_r W_r (the result feeds sharded work):
// all_gather_into's backward reduce-scatters, so every rank gets its rows of W.
TEST_P(FunctionalCollectives, AllGatherOfUnevenShardsReduceScattersItsGradient) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    auto& group = *ctx.world;
    const int64_t n = group.size(), me = group.rank(), rows = 5;
    const at::Tensor x = integral(1, {3, rows}), w = integral(2, {3, rows});
    at::Tensor local = x.narrow(1, dtensor::shard_offset(rows, n, me), dtensor::shard_length(rows, n, me)).contiguous();
    local.requires_grad_(true);
    at::Tensor full = dtensor::all_gather_into(local, 1, group, {rows});
    EXPECT_TRUE(at::equal(full.detach(), x));
    at::Tensor w_term = me == 0 ? w - integral(3, {3, rows}) * (n - 1) : integral(3, {3, rows});
    (full * w_term).sum().backward();
    EXPECT_TRUE(at::equal(local.grad(), w.narrow(1, dtensor::shard_offset(rows, n, me), local.size(1))));
  });
}

TEST_P(FunctionalCollectives, ReduceScatterAllReduceAndReduceGradHaveTheirDuals) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    auto& group = *ctx.world;
    const int64_t n = group.size(), me = group.rank();
    std::vector<at::Tensor> terms;
    for (int64_t r = 0; r < n; ++r) terms.push_back(rank_data(4, static_cast<int>(r), {6, 2}, at::kFloat, true));
    const at::Tensor sum = at::stack(terms).sum(0), w = integral(5, {6, 2});

    at::Tensor mine = terms[me].clone().requires_grad_(true);
    at::Tensor shard = dtensor::reduce_scatter(mine, 0, group);
    const int64_t off = dtensor::shard_offset(6, n, me), len = dtensor::shard_length(6, n, me);
    EXPECT_TRUE(at::equal(shard.detach(), sum.narrow(0, off, len)));
    (shard * w.narrow(0, off, len)).sum().backward();
    EXPECT_TRUE(at::equal(mine.grad(), w));  // all-gathered

    at::Tensor mine2 = terms[me].clone().requires_grad_(true);
    at::Tensor reduced = dtensor::all_reduce(mine2, group);
    EXPECT_TRUE(at::equal(reduced.detach(), sum));
    (reduced * w).sum().backward();
    EXPECT_TRUE(at::equal(mine2.grad(), w));  // identity: every rank holds the whole gradient

    at::Tensor replicated = w.clone().requires_grad_(true);
    at::Tensor same = dtensor::reduce_grad(replicated, group);
    EXPECT_TRUE(at::equal(same.detach(), w));
    (same * terms[me]).sum().backward();
    EXPECT_TRUE(at::equal(replicated.grad(), sum));  // the partial gradients summed
  });
}

TEST_P(FunctionalCollectives, AllToAllWithUnevenSplitsSendsItsGradientBack) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    auto& group = *ctx.world;
    const int64_t n = group.size(), me = group.rank();
    // Rank r sends (r + k) % 3 rows to rank k; row values name sender and receiver.
    auto rows = [](int64_t from, int64_t to) { return (from + to) % 3; };
    std::vector<int64_t> in_splits, out_splits;
    std::vector<at::Tensor> sent, expected;
    for (int64_t k = 0; k < n; ++k) {
      in_splits.push_back(rows(me, k));
      out_splits.push_back(rows(k, me));
      sent.push_back(at::full({rows(me, k), 2}, static_cast<double>(100 * me + k)));
      expected.push_back(at::full({rows(k, me), 2}, static_cast<double>(100 * k + me)));
    }
    at::Tensor input = at::cat(sent).requires_grad_(true);
    at::Tensor out = dtensor::all_to_all(input, group, out_splits, in_splits);
    EXPECT_TRUE(at::equal(out.detach(), at::cat(expected)));
    (out * out.detach()).sum().backward();  // gradient = the received values, sent back
    EXPECT_TRUE(at::equal(input.grad(), input.detach()));
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, FunctionalCollectives, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace
}  // namespace hyperparallel
