// DeviceMesh: axis groups have the right members (checked by a real all-reduce on each),
// sub-meshes and flatten, and bad shapes fail with the message.
#include <gtest/gtest.h>

#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/platform/user_error.h"
#include "support/multiprocess.h"

namespace hyperparallel {
namespace {

using mesh::DeviceMesh;
using mesh::init_device_mesh;
using testing::RankContext;
using testing::run_on_ranks;

// The members of `axis` seen from world rank `me` in a row-major mesh of `shape`.
std::vector<int> expected_members(const std::vector<int64_t>& shape, int axis, int me) {
  std::vector<int64_t> stride(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) stride[d] = stride[d + 1] * shape[d + 1];
  const int64_t coord = (me / stride[axis]) % shape[axis];
  std::vector<int> members;
  for (int64_t k = 0; k < shape[axis]; ++k) members.push_back(static_cast<int>(me + (k - coord) * stride[axis]));
  return members;
}

// Each axis group is checked twice: by its member list and by an all-reduce of world ranks.
void check_axes(RankContext& ctx, const std::vector<int64_t>& shape, const std::vector<std::string>& names) {
  DeviceMesh m = init_device_mesh(ctx.world, "cpu", shape, names);
  for (size_t a = 0; a < names.size(); ++a) {
    const auto want = expected_members(shape, static_cast<int>(a), ctx.rank);
    auto c = m.comm(names[a]);
    EXPECT_EQ(c->global_ranks(), want) << "axis " << names[a];
    EXPECT_EQ(m.size(names[a]), shape[a]);
    EXPECT_EQ(c->size(), shape[a]);
    EXPECT_EQ(m.local_rank(names[a]), c->rank());
    at::Tensor t = at::full({1}, static_cast<int64_t>(ctx.rank), at::kLong);
    c->all_reduce(t).wait();
    int64_t sum = 0;
    for (int r : want) sum += r;
    EXPECT_EQ(t.item<int64_t>(), sum) << "axis " << names[a];
  }
}

TEST(DeviceMesh, AxisGroupsForShape4) {
  run_on_ranks(4, [](RankContext& ctx) { check_axes(ctx, {4}, {"dp_shard"}); });
}

TEST(DeviceMesh, AxisGroupsForShape2x2) {
  run_on_ranks(4, [](RankContext& ctx) { check_axes(ctx, {2, 2}, {"dp_replicate", "dp_shard"}); });
}

TEST(DeviceMesh, AxisGroupsForShape1x4) {
  run_on_ranks(4, [](RankContext& ctx) { check_axes(ctx, {1, 4}, {"pp", "tp"}); });
}

TEST(DeviceMesh, AxisGroupsForShape2x1x2) {
  run_on_ranks(4, [](RankContext& ctx) { check_axes(ctx, {2, 1, 2}, {"dp", "cp", "tp"}); });
}

TEST(DeviceMesh, SubMeshesFlattenAndCaching) {
  run_on_ranks(4, [](RankContext& ctx) {
    DeviceMesh m = init_device_mesh(ctx.world, "cpu", {2, 1, 2}, {"dp", "cp", "tp"});
    // A single-axis sub-mesh shares the axis communicator (groups are cached).
    DeviceMesh tp = m["tp"];
    EXPECT_EQ(tp.ndim(), 1);
    EXPECT_EQ(tp.comm().get(), m.comm("tp").get());
    EXPECT_EQ(tp.rank(), m.local_rank("tp"));
    // Two axes: the ranks sharing this process's "dp" coordinate... here cp x tp.
    DeviceMesh cp_tp = m[{"cp", "tp"}];
    EXPECT_EQ(cp_tp.shape(), (std::vector<int64_t>{1, 2}));
    const int base = ctx.rank / 2 * 2;
    EXPECT_EQ(cp_tp.ranks(), (std::vector<int>{base, base + 1}));
    // flatten over (dp, tp) covers everyone; its group is the world's cached group.
    DeviceMesh dp_tp = m[{"dp", "tp"}].flatten("dp_tp");
    EXPECT_EQ(dp_tp.shape(), (std::vector<int64_t>{4}));
    EXPECT_EQ(dp_tp.comm()->size(), 4);
    EXPECT_EQ(dp_tp.comm().get(), ctx.world.get());
    at::Tensor t = at::ones({3});
    cp_tp.comm()->all_reduce(t).wait();
    EXPECT_TRUE(at::equal(t, at::full({3}, 2.0)));
    // Axis order given to a sub-mesh is kept: (tp, dp) walks tp outermost.
    DeviceMesh tp_dp = m[{"tp", "dp"}];
    EXPECT_EQ(tp_dp.ranks(), (std::vector<int>{0, 2, 1, 3}));
    EXPECT_EQ(tp_dp.local_rank("tp"), ctx.rank % 2);
    EXPECT_EQ(m.to_string(), "DeviceMesh(cpu, (dp=2, cp=1, tp=2))");
  });
}

std::string mesh_error(std::vector<int64_t> shape, std::vector<std::string> names, std::string device = "cpu") {
  auto world = comm::init_process_group(comm::RendezvousInfo{});
  try {
    init_device_mesh(world, device, shape, names);
  } catch (const UserError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(DeviceMesh, BadShapesFailWithTheMessage) {
  EXPECT_EQ(mesh_error({2, 2}, {"dp_replicate", "dp_shard"}), "mesh dp_replicate(2) x dp_shard(2) = 4 != world size 1");
  EXPECT_EQ(mesh_error({1, 1}, {"tp"}), "mesh shape has 2 axes but 1 names were given; name every axis");
  EXPECT_EQ(mesh_error({1, 1}, {"tp", "tp"}), "mesh axis name 'tp' is used twice");
  EXPECT_EQ(mesh_error({0}, {"tp"}), "mesh axis 'tp' has size 0; sizes must be >= 1");
  EXPECT_EQ(mesh_error({}, {}), "mesh shape is empty; give at least one axis, e.g. shape (4) names (dp_shard)");
  EXPECT_EQ(mesh_error({1}, {"tp"}, "cuda"),
            "device_type 'cuda' is not available: this build runs on 'cpu' (c10d Gloo)");
  auto world = comm::init_process_group(comm::RendezvousInfo{});
  DeviceMesh m = init_device_mesh(world, "cpu", {1}, {"tp"});
  try {
    m["ep"];
    ADD_FAILURE() << "no error for an unknown axis";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "mesh has no axis 'ep'; its axes are: tp");
  }
}

}  // namespace
}  // namespace hyperparallel
