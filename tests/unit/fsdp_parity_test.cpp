// fully_shard parity: FSDP on 2, 3 and 4 ranks trains a tiny transformer-shaped model
// (embedding, blocks, tied head; dims that do not divide by 3 or 4) for 20 AdamW steps on
// the same global batch as one process and matches its losses and parameters; the
// communication per step is exactly the expected collectives and bytes.
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/fsdp/module_hooks.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/platform/user_error.h"
#include "support/multiprocess.h"

namespace hyperparallel {
namespace {

using fsdp::hooked_forward;

constexpr int64_t kVocab = 37, kDim = 24, kHidden = 40, kLayers = 3, kSeq = 8, kBatch = 12;

struct Block : torch::nn::Module {
  Block() {
    norm = register_parameter("norm", at::ones({kDim}));
    fc1 = register_module("fc1", torch::nn::Linear(kDim, kHidden));
    fc2 = register_module("fc2", torch::nn::Linear(kHidden, kDim));
  }
  at::Tensor forward(const at::Tensor& x) {
    return hooked_forward(*this, [&] { return x + fc2(at::tanh(fc1(x * norm))); });
  }
  at::Tensor norm;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

struct TinyLM : torch::nn::Module {
  TinyLM() {
    embed = register_module("embed", torch::nn::Embedding(kVocab, kDim));
    for (int64_t i = 0; i < kLayers; ++i) blocks.push_back(register_module("layers" + std::to_string(i), std::make_shared<Block>()));
    final_norm = register_parameter("final_norm", at::ones({kDim}));
  }
  at::Tensor forward(const at::Tensor& tokens) {
    return hooked_forward(*this, [&] {
      at::Tensor h = embed(tokens);
      for (auto& b : blocks) h = b->forward(h);
      return at::matmul(h * final_norm, embed->weight.t());  // head tied to the embedding
    });
  }
  torch::nn::Embedding embed{nullptr};
  std::vector<std::shared_ptr<Block>> blocks;
  at::Tensor final_norm;
};

std::shared_ptr<TinyLM> make_model() {
  at::manual_seed(1234);
  return std::make_shared<TinyLM>();
}

// The global batch of step `step`: tokens and next-token targets.
std::pair<at::Tensor, at::Tensor> global_batch(int step) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(77 + step));
  at::Tensor seq = at::randint(0, kVocab, {kBatch, kSeq + 1}, gen, at::TensorOptions().dtype(at::kLong));
  return {seq.narrow(1, 0, kSeq).contiguous(), seq.narrow(1, 1, kSeq).contiguous()};
}

at::Tensor loss_of(TinyLM& model, const at::Tensor& tokens, const at::Tensor& targets) {
  return at::cross_entropy_loss(model.forward(tokens).reshape({-1, kVocab}), targets.reshape({-1}));
}

torch::optim::AdamW make_optimizer(TinyLM& model) {
  return torch::optim::AdamW(model.parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
}

struct Trajectory {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
};

Trajectory train_single_process(int steps) {
  auto model = make_model();
  auto opt = make_optimizer(*model);
  Trajectory t;
  for (int s = 0; s < steps; ++s) {
    auto [tokens, targets] = global_batch(s);
    at::Tensor loss = loss_of(*model, tokens, targets);
    opt.zero_grad();
    loss.backward();
    opt.step();
    t.losses.push_back(loss.item<double>());
  }
  for (const auto& item : model->named_parameters()) t.params[item.key()] = item.value().detach().clone();
  return t;
}

struct FsdpRun {
  bool reshard_after_forward = true;
};

void expect_parity(testing::RankContext& ctx, const FsdpRun& run) {
  constexpr int kSteps = 20;
  const Trajectory reference = train_single_process(kSteps);

  auto mesh = mesh::init_device_mesh(ctx.world, "cpu", {ctx.world_size}, {"dp_shard"});
  auto shard_comm = mesh.comm("dp_shard");
  auto model = make_model();
  fsdp::FullyShardOptions options;
  options.mesh = mesh;
  options.reshard_after_forward = run.reshard_after_forward;
  std::vector<fsdp::FSDPModule> units;
  for (auto& b : model->blocks) units.push_back(fsdp::fully_shard(*b, options));
  units.push_back(fsdp::fully_shard(*model, options));
  auto opt = make_optimizer(*model);

  const int64_t n = ctx.world_size, per_rank = kBatch / n;
  for (int s = 0; s < kSteps; ++s) {
    auto [tokens, targets] = global_batch(s);
    tokens = tokens.narrow(0, ctx.rank * per_rank, per_rank);
    targets = targets.narrow(0, ctx.rank * per_rank, per_rank);
    const auto before = shard_comm->counters();
    at::Tensor loss = loss_of(*model, tokens, targets);
    opt.zero_grad();
    loss.backward();
    opt.step();
    const auto step_comm = shard_comm->counters() - before;
    at::Tensor global = loss.detach().clone();
    ctx.world->all_reduce(global, comm::ReduceOp::kAvg).wait();
    EXPECT_NEAR(global.item<double>(), reference.losses[s], 1e-5 * std::abs(reference.losses[s])) << "step " << s;

    // Blocks: an all-gather in forward (and again in backward when resharded after
    // forward) and one reduce-scatter; the root keeps its parameters through backward.
    int64_t ag_calls = 0, ag_bytes = 0, rs_bytes = 0;
    for (auto& u : units) {
      const bool is_root = &u == &units.back();
      const int64_t gathers = (run.reshard_after_forward && !is_root) ? 2 : 1;
      ag_calls += gathers;
      ag_bytes += gathers * (n - 1) * u.sharded_numel() * 4;
      rs_bytes += (n - 1) * u.sharded_numel() * 4;
    }
    EXPECT_EQ(step_comm[comm::CollectiveKind::kAllGather].calls, ag_calls) << "step " << s;
    EXPECT_EQ(step_comm[comm::CollectiveKind::kAllGather].bytes, ag_bytes);
    EXPECT_EQ(step_comm[comm::CollectiveKind::kReduceScatter].calls, static_cast<int64_t>(units.size()));
    EXPECT_EQ(step_comm[comm::CollectiveKind::kReduceScatter].bytes, rs_bytes);
    EXPECT_EQ(step_comm.total_calls(), ag_calls + static_cast<int64_t>(units.size()));
    for (auto& u : units) EXPECT_EQ(u.state(), fsdp::UnitState::kSharded);
  }

  const auto full = fsdp::full_parameters(*model);
  ASSERT_EQ(full.size(), reference.params.size());
  for (const auto& [name, want] : reference.params) {
    ASSERT_TRUE(full.count(name)) << name;
    EXPECT_TRUE(at::allclose(full.at(name), want, 1e-5, 1e-6))
        << name << " max diff " << (full.at(name) - want).abs().max().item<double>();
  }
}

class FsdpParity : public ::testing::TestWithParam<int> {};

TEST_P(FsdpParity, MatchesOneProcessResharded) {
  testing::run_on_ranks(GetParam(), [](testing::RankContext& ctx) { expect_parity(ctx, {true}); });
}

TEST_P(FsdpParity, MatchesOneProcessKeptAfterForward) {
  testing::run_on_ranks(GetParam(), [](testing::RankContext& ctx) { expect_parity(ctx, {false}); });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, FsdpParity, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

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
    unit.unshard();
    EXPECT_EQ(model->blocks[0]->fc1->weight.sizes(), (std::vector<int64_t>{kHidden, kDim}));
    EXPECT_EQ(unit.state(), fsdp::UnitState::kUnsharded);
    unit.reshard();
    EXPECT_EQ(unit.state(), fsdp::UnitState::kSharded);
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
  EXPECT_THROW(fsdp::fully_shard(*model->blocks[1], no_mesh), UserError);
}

}  // namespace
}  // namespace hyperparallel
