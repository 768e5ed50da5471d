// Every collective is exact for world sizes 1-4, with sizes that do not divide by the
// world size, for fp32 / fp16 / bf16 / int64, and with several collectives in flight.
#include <gtest/gtest.h>

#include <algorithm>

#include "hyperparallel/comm/communicator.h"
#include "support/multiprocess.h"
#include "support/tensor_data.h"

namespace hyperparallel {
namespace {

using comm::ReduceOp;
using testing::rank_data;
using testing::RankContext;
using testing::run_on_ranks;

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kHalf, at::kBFloat16, at::kLong};

// The result our reductions promise: rows reduced in rank order in the accumulation dtype
// (fp32 for half types), cast once.
at::Tensor reference_reduce(const std::vector<at::Tensor>& inputs, ReduceOp op) {
  const auto dtype = inputs[0].scalar_type();
  const auto acc_type = (dtype == at::kHalf || dtype == at::kBFloat16) ? at::kFloat : dtype;
  at::Tensor acc = inputs[0].to(acc_type, false, true);
  for (size_t i = 1; i < inputs.size(); ++i) {
    const at::Tensor x = inputs[i].to(acc_type);
    if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc = acc + x;
    if (op == ReduceOp::kMax) acc = at::maximum(acc, x);
    if (op == ReduceOp::kMin) acc = at::minimum(acc, x);
  }
  if (op == ReduceOp::kAvg) acc = acc / static_cast<double>(inputs.size());
  return acc.to(dtype);
}

class CommCollectives : public ::testing::TestWithParam<int> {};

TEST_P(CommCollectives, AllGatherIsExactForEveryDtype) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    auto& c = *ctx.world;
    for (auto dtype : kDtypes) {
      for (int64_t m : {1, 7, 1000}) {
        at::Tensor in = rank_data(1, c.rank(), {m}, dtype);
        at::Tensor out = at::empty({c.size() * m}, in.options());
        c.all_gather(out, in).wait();
        std::vector<at::Tensor> parts;
        for (int r = 0; r < c.size(); ++r) parts.push_back(rank_data(1, r, {m}, dtype));
        EXPECT_TRUE(at::equal(out, at::cat(parts))) << c10::toString(dtype) << " m=" << m;
      }
    }
  });
}

TEST_P(CommCollectives, ReduceScatterMatchesRankOrderReduction) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    auto& c = *ctx.world;
    const int n = c.size();
    for (auto dtype : kDtypes) {
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        if (op == ReduceOp::kAvg && dtype == at::kLong) continue;
        const int64_t m = 13;  // per-rank shard; the flat input is n * 13
        at::Tensor in = rank_data(2, c.rank(), {n * m}, dtype);
        at::Tensor out = at::empty({m}, in.options());
        c.reduce_scatter(out, in, op).wait();
        std::vector<at::Tensor> mine;
        for (int r = 0; r < n; ++r) mine.push_back(rank_data(2, r, {n * m}, dtype).narrow(0, c.rank() * m, m));
        EXPECT_TRUE(at::equal(out, reference_reduce(mine, op))) << c10::toString(dtype) << " " << to_string(op);
      }
    }
  });
}

TEST_P(CommCollectives, AllReduceIsExact) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    auto& c = *ctx.world;
    const int n = c.size();
    for (auto dtype : kDtypes) {
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        if (op == ReduceOp::kAvg && dtype == at::kLong) continue;
        for (int64_t m : {1, 7, 301}) {
          // Gloo's own fp32/int64 ring reduces in its own order: integer values keep that exact.
          const bool native = dtype == at::kFloat || dtype == at::kLong;
          at::Tensor t = rank_data(3, c.rank(), {m}, dtype, native);
          c.all_reduce(t, op).wait();
          std::vector<at::Tensor> all;
          for (int r = 0; r < n; ++r) all.push_back(rank_data(3, r, {m}, dtype, native));
          EXPECT_TRUE(at::equal(t, reference_reduce(all, op)))
              << c10::toString(dtype) << " " << to_string(op) << " m=" << m;
        }
      }
    }
  });
}

TEST_P(CommCollectives, Bf16ReductionEqualsFp32ReductionCastOnce) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    auto& c = *ctx.world;
    at::Tensor bf16 = rank_data(4, c.rank(), {257}, at::kBFloat16);
    at::Tensor fp32 = bf16.to(at::kFloat);
    c.all_reduce(bf16).wait();
    c.all_reduce(fp32).wait();
    // Summing the same fp32 values in a different order may differ in the last fp32 bit,
    // which can flip a bf16 rounding; allow one bf16 ulp, and require most to be exact.
    const at::Tensor want = fp32.to(at::kBFloat16);
    const at::Tensor diff = (bf16.to(at::kFloat) - want.to(at::kFloat)).abs();
    const at::Tensor ulp = want.to(at::kFloat).abs().clamp_min(1e-30) * (1.0 / 128);
    EXPECT_TRUE((diff <= ulp).all().item<bool>());
    EXPECT_GE(bf16.eq(want).sum().item<int64_t>(), 250);
  });
}

TEST_P(CommCollectives, BroadcastFromEveryRoot) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    auto& c = *ctx.world;
    for (auto dtype : kDtypes) {
      for (int root = 0; root < c.size(); ++root) {
        at::Tensor t = c.rank() == root ? rank_data(5, root, {3, 5}, dtype) : at::zeros({3, 5}, dtype);
        c.broadcast(t, root).wait();
        EXPECT_TRUE(at::equal(t, rank_data(5, root, {3, 5}, dtype))) << c10::toString(dtype) << " root " << root;
      }
    }
  });
}

TEST_P(CommCollectives, AllToAllWithUnevenSplits) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    auto& c = *ctx.world;
    const int n = c.size(), me = c.rank();
    // Rank s sends (s + d) % 3 rows to rank d (zero rows included); rows have 4 columns.
    auto rows = [](int s, int d) { return static_cast<int64_t>((s + d) % 3); };
    for (auto dtype : kDtypes) {
      std::vector<int64_t> in_splits, out_splits;
      int64_t in_rows = 0, out_rows = 0;
      for (int d = 0; d < n; ++d) {
        in_splits.push_back(rows(me, d));
        out_splits.push_back(rows(d, me));
        in_rows += in_splits.back();
        out_rows += out_splits.back();
      }
      at::Tensor in = rank_data(6, me, {in_rows, 4}, dtype);
      at::Tensor out = at::full({out_rows, 4}, 0, in.options());
      c.all_to_all(out, in, out_splits, in_splits).wait();
      std::vector<at::Tensor> want;
      for (int s = 0; s < n; ++s) {
        int64_t offset = 0;
        for (int d = 0; d < me; ++d) offset += rows(s, d);
        want.push_back(rank_data(6, s, {[&] { int64_t t = 0; for (int d = 0; d < n; ++d) t += rows(s, d); return t; }(), 4}, dtype)
                           .narrow(0, offset, rows(s, me)));
      }
      EXPECT_TRUE(at::equal(out, at::cat(want))) << c10::toString(dtype);
    }
  });
}

TEST_P(CommCollectives, SendRecvAroundARing) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    auto& c = *ctx.world;
    const int n = c.size(), me = c.rank();
    if (n == 1) return;
    for (auto dtype : kDtypes) {
      at::Tensor out = rank_data(7, me, {9}, dtype);
      at::Tensor in = at::empty({9}, out.options());
      auto s = c.send(out, (me + 1) % n, /*tag=*/3);
      auto r = c.recv(in, (me + n - 1) % n, /*tag=*/3);
      s.wait();
      r.wait();
      EXPECT_TRUE(at::equal(in, rank_data(7, (me + n - 1) % n, {9}, dtype))) << c10::toString(dtype);
    }
  });
}

TEST_P(CommCollectives, SeveralCollectivesInFlightAtOnce) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    auto& c = *ctx.world;
    const int n = c.size(), me = c.rank();
    at::Tensor ag_in = rank_data(8, me, {11}, at::kBFloat16);
    at::Tensor ag_out = at::empty({n * 11}, at::kBFloat16);
    at::Tensor rs_in = rank_data(9, me, {n * 5}, at::kFloat);
    at::Tensor rs_out = at::empty({5});
    at::Tensor ar = rank_data(10, me, {6}, at::kHalf);
    at::Tensor ar2 = rank_data(11, me, {17}, at::kLong);
    at::Tensor bc = me == 0 ? rank_data(12, 0, {4}, at::kFloat) : at::zeros({4});
    std::vector<comm::CommHandle> handles;
    handles.push_back(c.all_gather(ag_out, ag_in));
    handles.push_back(c.reduce_scatter(rs_out, rs_in));
    handles.push_back(c.all_reduce(ar));
    handles.push_back(c.all_reduce(ar2));
    handles.push_back(c.broadcast(bc, 0));
    for (auto& h : handles) h.wait();

    std::vector<at::Tensor> ag_parts, rs_parts, ar_parts, ar2_parts;
    for (int r = 0; r < n; ++r) {
      ag_parts.push_back(rank_data(8, r, {11}, at::kBFloat16));
      rs_parts.push_back(rank_data(9, r, {n * 5}, at::kFloat).narrow(0, me * 5, 5));
      ar_parts.push_back(rank_data(10, r, {6}, at::kHalf));
      ar2_parts.push_back(rank_data(11, r, {17}, at::kLong));
    }
    EXPECT_TRUE(at::equal(ag_out, at::cat(ag_parts)));
    EXPECT_TRUE(at::equal(rs_out, reference_reduce(rs_parts, ReduceOp::kSum)));
    EXPECT_TRUE(at::equal(ar, reference_reduce(ar_parts, ReduceOp::kSum)));
    EXPECT_TRUE(at::equal(ar2, reference_reduce(ar2_parts, ReduceOp::kSum)));
    EXPECT_TRUE(at::equal(bc, rank_data(12, 0, {4}, at::kFloat)));
  });
}

// Ranks wait in different orders (as overlapped schedules do): odd ranks wait last-issued
// first. The bf16 all-reduces' second phases and the all-gathers' tags still meet.
TEST_P(CommCollectives, RanksMayWaitForTheirHandlesInDifferentOrders) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    auto& c = *ctx.world;
    const int n = c.size(), me = c.rank();
    std::vector<at::Tensor> reduced, gathered;
    std::vector<comm::CommHandle> handles;
    for (int k = 0; k < 3; ++k) {
      reduced.push_back(rank_data(20 + k, me, {5 + k}, at::kBFloat16));
      handles.push_back(c.all_reduce(reduced.back()));
      at::Tensor in = rank_data(30 + k, me, {3 + k}, at::kFloat);
      gathered.push_back(at::empty({n * (3 + k)}));
      handles.push_back(c.all_gather(gathered.back(), in));
    }
    if (me % 2 == 1) std::reverse(handles.begin(), handles.end());
    for (auto& h : handles) h.wait();
    // Waiting for a later one first completes the earlier ones only: here rank 0 waits B, A,
    // then a blocking all-reduce, then C; the others A, B, the all-reduce, C.
    std::vector<at::Tensor> abc;
    std::vector<comm::CommHandle> three;
    for (int k = 0; k < 3; ++k) {
      abc.push_back(rank_data(40 + k, me, {9}, at::kBFloat16));
      three.push_back(c.all_reduce(abc.back()));
    }
    if (me == 0) std::swap(three[0], three[1]);
    three[0].wait();
    three[1].wait();
    at::Tensor blocking = at::ones({3});
    c.all_reduce(blocking).wait();
    three[2].wait();
    EXPECT_TRUE(at::equal(blocking, at::full({3}, static_cast<double>(n))));
    for (int k = 0; k < 3; ++k) {
      std::vector<at::Tensor> ar_parts, ag_parts;
      for (int r = 0; r < n; ++r) {
        ar_parts.push_back(rank_data(20 + k, r, {5 + k}, at::kBFloat16));
        ag_parts.push_back(rank_data(30 + k, r, {3 + k}, at::kFloat));
      }
      EXPECT_TRUE(at::equal(reduced[k], reference_reduce(ar_parts, ReduceOp::kSum))) << k;
      EXPECT_TRUE(at::equal(gathered[k], at::cat(ag_parts))) << k;
      std::vector<at::Tensor> abc_parts;
      for (int r = 0; r < n; ++r) abc_parts.push_back(rank_data(40 + k, r, {9}, at::kBFloat16));
      EXPECT_TRUE(at::equal(abc[k], reference_reduce(abc_parts, ReduceOp::kSum))) << "abc " << k;
    }
  });
}

TEST_P(CommCollectives, AllGatherOutputsCanBeViewsIntoOneBuffer) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    auto& c = *ctx.world;
    const int n = c.size();
    // Two units gathered into disjoint halves of one flat buffer; parameters would be views.
    at::Tensor flat = at::zeros({2 * n * 6});
    at::Tensor first = flat.narrow(0, 0, n * 6), second = flat.narrow(0, n * 6, n * 6);
    auto h1 = c.all_gather(first, at::full({6}, 1.0 + c.rank()));
    auto h2 = c.all_gather(second, at::full({6}, -1.0 - c.rank()));
    h1.wait();
    h2.wait();
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(at::equal(flat.narrow(0, r * 6, 6), at::full({6}, 1.0 + r)));
      EXPECT_TRUE(at::equal(flat.narrow(0, n * 6 + r * 6, 6), at::full({6}, -1.0 - r)));
    }
  });
}

// Blocked layout: block k of the unsharded buffer holds the N ranks' pieces of tensor k.
TEST_P(CommCollectives, BlockedAllGatherAndReduceScatterAreExact) {
  run_on_ranks(GetParam(), [](RankContext& ctx) {
    auto& c = *ctx.world;
    const int n = c.size(), me = c.rank();
    const std::vector<int64_t> blocks = {5, 0, 3, 12};
    const int64_t total = 20;
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      // all-gather: rank r's shard is [piece of block 0 | piece of block 1 | ...].
      at::Tensor shard = rank_data(13, me, {total}, dtype);
      at::Tensor unsharded = at::zeros({n * total}, shard.options());
      c.all_gather_blocks(unsharded, shard, blocks).wait();
      std::vector<at::Tensor> want;
      int64_t offset = 0;
      for (int64_t b : blocks) {
        for (int r = 0; r < n; ++r) want.push_back(rank_data(13, r, {total}, dtype).narrow(0, offset, b));
        offset += b;
      }
      EXPECT_TRUE(at::equal(unsharded, at::cat(want))) << c10::toString(dtype);
      // reduce-scatter: my piece of block k is at [off_k + me * b_k, +b_k) of every rank's input.
      at::Tensor in = rank_data(14, me, {n * total}, dtype);
      at::Tensor out = at::empty({total}, in.options());
      c.reduce_scatter_blocks(out, in, blocks, ReduceOp::kAvg).wait();
      std::vector<at::Tensor> rows;
      for (int r = 0; r < n; ++r) {
        at::Tensor theirs = rank_data(14, r, {n * total}, dtype);
        std::vector<at::Tensor> pieces;
        int64_t off = 0;
        for (int64_t b : blocks) {
          pieces.push_back(theirs.narrow(0, off + me * b, b));
          off += n * b;
        }
        rows.push_back(at::cat(pieces));
      }
      EXPECT_TRUE(at::equal(out, reference_reduce(rows, ReduceOp::kAvg))) << c10::toString(dtype);
    }
    // Counters: one call each, ring bytes of the shard.
    c.reset_counters();
    c.all_gather_blocks(at::empty({n * total}), at::ones({total}), blocks).wait();
    c.reduce_scatter_blocks(at::empty({total}), at::ones({n * total}), blocks).wait();
    EXPECT_EQ(c.counters()[comm::CollectiveKind::kAllGather].calls, 1);
    EXPECT_EQ(c.counters()[comm::CollectiveKind::kAllGather].bytes, (n - 1) * total * 4);
    EXPECT_EQ(c.counters()[comm::CollectiveKind::kReduceScatter].calls, 1);
    EXPECT_EQ(c.counters()[comm::CollectiveKind::kReduceScatter].bytes, (n - 1) * total * 4);
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CommCollectives, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace
}  // namespace hyperparallel
