// ParallelDims validates degrees against the world size with messages naming every
// factor, infers dp_shard and edp, and builds dense and expert meshes over the same ranks.
#include <gtest/gtest.h>

#include "hyperparallel/mesh/parallel_dims.h"
#include "hyperparallel/platform/user_error.h"
#include "support/multiprocess.h"

namespace hyperparallel {
namespace {

using mesh::ParallelDims;

std::string error_of(const ParallelDims& d, int64_t world) {
  try {
    d.resolved(world);
  } catch (const UserError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(ParallelDims, InfersDpShardAndEdp) {
  ParallelDims d;
  d.dp_replicate = 2;
  d.tp = 2;
  d.ep = 4;
  const ParallelDims r = d.resolved(16);
  EXPECT_EQ(r.dp_shard, 4);
  EXPECT_EQ(r.edp_shard, 2);  // dp_shard(4) x tp(2) = 8 = edp(2) x ep(4)
  EXPECT_EQ(r.dp(), 8);
}

TEST(ParallelDims, ErrorsNameEveryFactor) {
  ParallelDims d;
  d.dp_replicate = 2;
  d.dp_shard = 3;
  EXPECT_EQ(error_of(d, 4),
            "dp_replicate(2) x dp_shard(3) x cp(1) x tp(1) x pp(1) = 6 != world size 4; set dp_shard_size: -1 to infer it");
  ParallelDims odd;
  odd.tp = 3;
  EXPECT_EQ(error_of(odd, 4),
            "cannot infer dp_shard: world size 4 is not divisible by dp_replicate(1) x cp(1) x tp(3) x pp(1) = 3");
  ParallelDims ep;
  ep.ep = 3;
  EXPECT_EQ(error_of(ep, 4), "ep(3) does not divide dp_shard(4) x cp(1) x tp(1) = 4; experts reuse those ranks as edp x ep");
  ParallelDims edp;
  edp.ep = 2;
  edp.edp_shard = 4;
  EXPECT_EQ(error_of(edp, 4),
            "edp_shard(4) x ep(2) = 8 != dp_shard(4) x cp(1) x tp(1) = 4; set edp_shard_size: -1 to infer it");
  ParallelDims zero;
  zero.tp = 0;
  EXPECT_EQ(error_of(zero, 4), "tp = 0 is not allowed; use an integer >= 1");
  ParallelDims neg;
  neg.dp_shard = -2;
  EXPECT_EQ(error_of(neg, 4), "dp_shard = -2 is not allowed; use an integer >= 1 or -1 to infer it");
}

TEST(ParallelDims, DenseAndExpertMeshesShareRanks) {
  testing::run_on_ranks(4, [](testing::RankContext& ctx) {
    ParallelDims d;
    d.dp_replicate = 2;  // HSDP 2 x 2
    d.ep = 2;
    auto dense = d.build_mesh(ctx.world);
    auto expert = d.build_expert_mesh(ctx.world);
    EXPECT_EQ(dense.shape(), (std::vector<int64_t>{1, 2, 2, 1, 1}));
    EXPECT_EQ(expert.shape(), (std::vector<int64_t>{1, 2, 1, 2}));
    // Within one replica, the dp_shard group and the ep group are the same two ranks.
    EXPECT_EQ(dense.comm("dp_shard")->global_ranks(), expert.comm("ep")->global_ranks());
    EXPECT_EQ(dense.comm("dp_replicate")->global_ranks(), expert.comm("dp_replicate")->global_ranks());
    EXPECT_EQ(dense.comm("dp_shard").get(), expert.comm("ep").get());  // one cached group
  });
}

}  // namespace
}  // namespace hyperparallel
