// fully_shard's shards and states: how parameters are cut over ranks (ceil rows, padding),
// the optimizer seeing shards and sharded state, the units' training states through a step,
// the root inheriting its mesh, and tied parameters across units refused. The model and batch
// are support/fsdp_toy_setup.h's, as in fsdp_parity_test.cpp.
#include <gtest/gtest.h>

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/fsdp/module_hooks.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/platform/user_error.h"
#include "support/multiprocess.h"
#include "support/fsdp_toy_setup.h"

namespace hyperparallel {
namespace {

using namespace testing::fsdp_toy;

TEST(FsdpShards, ParametersHoldCeilRowsAndOptimizerSeesShards) {
  testing::run_on_ranks(3, [](testing::RankContext& ctx) {
    auto mesh = mesh::init_device_mesh(ctx.world, "cpu", {3}, {"dp_shard"});
    auto model = make_model();
    fsdp::FullyShardOptions options;
    options.mesh = mesh;
    auto unit = fsdp::fully_shard(*model->blocks[0], options);
    // fc1.weight has 40 rows: 14, 14, 12 over 3 ranks; the flat shard holds 14 rows (padded).
    const int64_t rows = ctx.rank < 2 ? 14 : 12;
    EXPECT_EQ(model->blocks[0]->fc1->weight.sizes(), (std::vector<int64_t>{rows, kDim}));
    EXPECT_EQ(model->blocks[0]->fc2->weight.sizes(), (std::vector<int64_t>{8, kHidden}));
    const int64_t block_numel = 14 * kDim + 14 + 8 * kHidden + 8 + 8;  // fc1 w,b; fc2 w,b; norm
    EXPECT_EQ(unit.sharded_numel(), block_numel);
    EXPECT_EQ(unit.unsharded_numel(), 3 * block_numel);
    auto pending = unit.unshard();  // issued; the parameters are still shards
    EXPECT_EQ(unit.state(), fsdp::UnitState::kSharded);
    pending.wait();
    EXPECT_EQ(model->blocks[0]->fc1->weight.sizes(), (std::vector<int64_t>{kHidden, kDim}));
    EXPECT_EQ(unit.state(), fsdp::UnitState::kUnsharded);
    unit.reshard();
    EXPECT_EQ(unit.state(), fsdp::UnitState::kSharded);
  });
}

TEST(FsdpShards, OptimizerStateIsShardedWithTheParameters) {
  testing::run_on_ranks(3, [](testing::RankContext& ctx) {
    auto mesh = mesh::init_device_mesh(ctx.world, "cpu", {3}, {"dp_shard"});
    auto model = make_model();
    int64_t total = 0, padded_share = 0;
    for (const auto& p : model->parameters()) {
      total += p.numel();
      const int64_t rows = p.dim() ? p.size(0) : 1;
      padded_share += (rows + 2) / 3 * (p.numel() / rows);
    }
    fsdp::FullyShardOptions options;
    options.mesh = mesh;
    std::vector<fsdp::FSDPModule> units;
    for (auto& b : model->blocks) units.push_back(fsdp::fully_shard(*b, options));
    units.push_back(fsdp::fully_shard(*model, options));
    auto opt = make_optimizer(*model);
    auto [tokens, targets] = global_batch(0);
    at::Tensor loss = loss_of(*model, tokens.narrow(0, ctx.rank * 4, 4), targets.narrow(0, ctx.rank * 4, 4));
    opt.zero_grad();
    loss.backward();
    opt.step();
    // Parameter and gradient buffers: ceil(dim0 / 3) rows of every parameter, padding included.
    int64_t flat = 0;
    for (auto& u : units) flat += u.sharded_numel();
    EXPECT_EQ(flat, padded_share);
    // Visible shards and AdamW's two moments cover every element exactly once across ranks.
    int64_t local_params = 0, local_state = 0;
    for (const auto& p : model->parameters()) {
      local_params += p.numel();
      EXPECT_EQ(p.grad().numel(), p.numel());
    }
    for (const auto& item : opt.state()) {
      const auto& state = static_cast<const torch::optim::AdamWParamState&>(*item.second);
      local_state += state.exp_avg().numel() + state.exp_avg_sq().numel();
    }
    EXPECT_EQ(local_state, 2 * local_params);
    at::Tensor sums = at::tensor({local_params, local_state}, at::kLong);
    ctx.world->all_reduce(sums).wait();
    EXPECT_EQ(sums[0].item<int64_t>(), total);
    EXPECT_EQ(sums[1].item<int64_t>(), 2 * total);
  });
}

// The training state of the units through one step: FORWARD only inside forward, the root in
// PRE_BACKWARD as soon as its output's gradient arrives (a block not yet), every unit IDLE
// after the backward.
TEST(FsdpShards, TrainingStatesFollowTheStep) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    auto model = make_model();
    fsdp::FullyShardOptions options;
    options.mesh = mesh::init_device_mesh(ctx.world, "cpu", {2}, {"dp_shard"});
    std::vector<fsdp::FSDPModule> blocks;
    for (auto& block : model->blocks) blocks.push_back(fsdp::fully_shard(*block, options));
    fsdp::FSDPModule root = fsdp::fully_shard(*model, options);
    auto [tokens, targets] = global_batch(0);
    at::Tensor logits = model->forward(tokens);
    EXPECT_EQ(root.training_state(), fsdp::TrainingState::kIdle);
    EXPECT_EQ(blocks[0].training_state(), fsdp::TrainingState::kIdle);
    std::vector<fsdp::TrainingState> seen;
    logits.register_hook([&](const at::Tensor&) {
      seen = {root.training_state(), blocks.back().training_state()};
    });
    at::cross_entropy_loss(logits.reshape({-1, kVocab}), targets.reshape({-1})).backward();
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_EQ(seen[0], fsdp::TrainingState::kPreBackward);
    EXPECT_EQ(seen[1], fsdp::TrainingState::kIdle);
    for (auto& u : blocks) EXPECT_EQ(u.training_state(), fsdp::TrainingState::kIdle);
    EXPECT_EQ(root.training_state(), fsdp::TrainingState::kIdle);
    EXPECT_STREQ(fsdp::to_string(fsdp::TrainingState::kPostBackward), "POST_BACKWARD");
  });
}

TEST(FsdpShards, TheRootInheritsTheMeshOfTheUnitsBelow) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    auto model = make_model();
    fsdp::FullyShardOptions options;
    options.mesh = mesh::init_device_mesh(ctx.world, "cpu", {2}, {"dp_shard"});
    for (auto& block : model->blocks) fsdp::fully_shard(*block, options);
    fsdp::FSDPModule root = fsdp::fully_shard(*model, fsdp::FullyShardOptions{});  // no mesh: the layers'
    const auto shards = fsdp::sharded_state_dict(*model);
    const auto& embed = shards.at("embed.weight");
    EXPECT_EQ(embed.global_shape[0], kVocab);  // 37 rows over 2 ranks: 19 and 18
    EXPECT_EQ(embed.local.size(0), ctx.rank == 0 ? 19 : 18);
    EXPECT_EQ(embed.row_offset, ctx.rank * 19);
    EXPECT_EQ(root.state(), fsdp::UnitState::kSharded);
  });
}

TEST(FsdpShards, TiedParametersAcrossUnitsAreAnError) {
  auto world = comm::init_process_group(comm::RendezvousInfo{});
  auto mesh = mesh::init_device_mesh(world, "cpu", {1}, {"dp_shard"});
  auto model = make_model();
  fsdp::FullyShardOptions options;
  options.mesh = mesh;
  // Tie block 0's norm into the root under another name, then shard the block alone.
  model->register_parameter("alias_of_norm", model->blocks[0]->norm);
  fsdp::fully_shard(*model->blocks[0], options);
  try {
    fsdp::fully_shard(*model, options);
    ADD_FAILURE() << "no error for a parameter tied across units";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter alias_of_norm is tied to a parameter of a unit below"),
              std::string::npos)
        << e.what();
  }
  fsdp::FullyShardOptions no_mesh;
  try {
    fsdp::fully_shard(*model->blocks[1], no_mesh);
    ADD_FAILURE() << "no error for a first fully_shard without a mesh";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("no module below is sharded yet; pass a mesh"), std::string::npos) << e.what();
  }
  fsdp::FullyShardOptions bad_group = options;
  bad_group.reshard_after_forward = 2;  // 2 does not divide a shard group of 1
  try {
    fsdp::fully_shard(*model->blocks[1], bad_group);
    ADD_FAILURE() << "no error for reshard_after_forward = 2 on 1 rank";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("reshard_after_forward = 2 must divide the shard group size 1"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hyperparallel
