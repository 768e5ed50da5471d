// fully_shard parity: FSDP on 2, 3 and 4 ranks trains a tiny transformer-shaped model
// (embedding, blocks, tied head; dims that do not divide by 3 or 4) for 20 AdamW steps on
// the same global batch as one process and matches its losses and parameters; the
// communication per step is exactly the expected collectives and bytes.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <thread>
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
#include "support/fsdp_toy_setup.h"

namespace hyperparallel {
namespace {

using namespace testing::fsdp_toy;

struct Trajectory {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
};

Trajectory train_single_process(int steps, bool freeze_final_norm = false) {
  auto model = make_model(freeze_final_norm);
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
  bool comm_fusion = true;
  int prefetch_depth = 1;
  bool hsdp = false;              // 2 x (world / 2): replicate x shard
  int micro_batches = 1;          // gradient accumulation, sync off for all but the last
  bool sum_with_scaling = false;  // reduce "sum" scaled by 1/dp: the same as "avg"
  int delay_before_step_max_ms = 0;  // races: a random sleep before each optimizer step
  bool replicate_norms = false;      // blocks' norms replicated (all-reduced), not sharded
  bool ignore_final_norm = false;    // the final norm frozen and left out of FSDP
  bool offload = false;
  int reshard_group = 0;  // reshard_after_forward = k
  bool shard_dim1 = false;  // shard_placement_fn: 2-D weights on dim 1
  bool list_unit = false;   // blocks 0 and 1 form one unit
  bool stray_unshard = false;  // every block's unshard() issued right before the step, never waited for
  bool grads_set_to_none = false;  // gradients dropped (LibTorch 2.x's zero_grad) instead of zeroed
  bool zero_grad_in_place = false;  // zero_grad(false): the shard gradients are kept and summed into
};

void expect_parity(testing::RankContext& ctx, const FsdpRun& run) {
  constexpr int kSteps = 20;
  // A lone rank gets every core; this model's tensors are too small to split, and OpenMP's
  // spinning barriers on a busy machine made the world of one 10x slower than the others.
  at::set_num_threads(1);
  const Trajectory reference = train_single_process(kSteps, run.ignore_final_norm);

  const int64_t n = ctx.world_size;
  auto mesh = run.hsdp ? mesh::init_device_mesh(ctx.world, "cpu", {2, n / 2}, {"dp_replicate", "dp_shard"})
                       : mesh::init_device_mesh(ctx.world, "cpu", {n}, {"dp_shard"});
  auto shard_comm = mesh.comm("dp_shard");
  auto replicate_comm = run.hsdp ? mesh.comm("dp_replicate") : nullptr;
  const int64_t shards = shard_comm->size();
  auto model = make_model(run.ignore_final_norm);
  fsdp::FullyShardOptions options;
  options.mesh = mesh;
  options.reshard_after_forward = run.reshard_after_forward;
  if (run.reshard_group > 0) options.reshard_after_forward = run.reshard_group;
  if (run.shard_dim1) {
    options.shard_placement_fn = [](const std::string&, const at::Tensor& p) -> std::optional<int64_t> {
      if (p.dim() == 2) return 1;
      return std::nullopt;
    };
  }
  if (run.ignore_final_norm) options.ignored_params = {model->final_norm};
  if (run.offload) options.offload_policy = fsdp::CPUOffloadPolicy();
  if (run.replicate_norms) {
    for (auto& b : model->blocks) options.replicate_params.push_back(b->norm);
  }
  options.comm_fusion = run.comm_fusion;
  options.forward_prefetch_depth = options.backward_prefetch_depth = run.prefetch_depth;
  std::vector<fsdp::FSDPModule> units;
  if (run.list_unit) {
    units.push_back(fsdp::fully_shard({model->blocks[0].get(), model->blocks[1].get()}, options));
    units.push_back(fsdp::fully_shard(*model->blocks[2], options));
  } else {
    for (auto& b : model->blocks) units.push_back(fsdp::fully_shard(*b, options));
  }
  units.push_back(fsdp::fully_shard(*model, options));
  fsdp::FSDPModule& root = units.back();
  if (run.shard_dim1) {
    // fc2.weight [24, 40] sharded on dim 1: ceil(40 / n) columns per rank, fewer on the last.
    const int64_t cols = (kHidden + n - 1) / n;
    const int64_t mine = std::max<int64_t>(0, std::min<int64_t>(kHidden, (ctx.rank + 1) * cols) - ctx.rank * cols);
    EXPECT_EQ(model->blocks[0]->fc2->weight.sizes(), (std::vector<int64_t>{kDim, mine}));
  }
  if (run.sum_with_scaling) {
    root.set_reduce_op_type("sum");
    root.set_gradient_scaling_factor(1.0 / static_cast<double>(n));
  }
  auto opt = make_optimizer(*model);

  const int64_t per_rank = kBatch / n, per_micro = per_rank / run.micro_batches;
  for (int s = 0; s < kSteps; ++s) {
    auto [tokens, targets] = global_batch(s);
    tokens = tokens.narrow(0, ctx.rank * per_rank, per_rank);
    targets = targets.narrow(0, ctx.rank * per_rank, per_rank);
    const auto before = shard_comm->counters();
    std::shared_ptr<comm::Communicator> group_comm;
    comm::CommCounters group_before;
    if (run.reshard_group > 0) {
      std::vector<int> members;
      for (int i = 0; i < run.reshard_group; ++i) members.push_back(ctx.rank / run.reshard_group * run.reshard_group + i);
      group_comm = ctx.world->group(members, "post_forward");  // the unit's cached group
      group_before = group_comm->counters();
    }
    const auto replicate_before = replicate_comm ? replicate_comm->counters() : comm::CommCounters{};
    root.reset_max_live_unsharded_units();
    if (run.grads_set_to_none) {
      for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    } else if (run.zero_grad_in_place) {
      opt.zero_grad(false);
    } else {
      opt.zero_grad();
    }
    double local_loss = 0;
    for (int m = 0; m < run.micro_batches; ++m) {
      root.set_requires_gradient_sync(m == run.micro_batches - 1);
      at::Tensor loss = loss_of(*model, tokens.narrow(0, m * per_micro, per_micro), targets.narrow(0, m * per_micro, per_micro));
      (loss / run.micro_batches).backward();
      local_loss += loss.item<double>() / run.micro_batches;
      if (m == 0 && run.micro_batches > 1) {
        // An unsynced backward moves no gradient.
        EXPECT_EQ((shard_comm->counters() - before)[comm::CollectiveKind::kReduceScatter].calls, 0);
      }
    }
    if (run.delay_before_step_max_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds((s * 7 + ctx.rank * 13) % (run.delay_before_step_max_ms + 1)));
    }
    if (run.stray_unshard) {
      for (size_t u = 0; u + 1 < units.size(); ++u) units[u].unshard();  // the handles are dropped
    }
    opt.step();
    const auto step_comm = shard_comm->counters() - before;
    at::Tensor global = at::full({1}, local_loss, at::kDouble);
    ctx.world->all_reduce(global, comm::ReduceOp::kAvg).wait();
    EXPECT_NEAR(global.item<double>(), reference.losses[s], 1e-5 * std::abs(reference.losses[s])) << "step " << s;

    // Per micro-batch, blocks all-gather in forward (and again in backward when resharded
    // after forward). One reduce-scatter per
    // unit per step (only the synced backward); HSDP adds one all-reduce per unit.
    // One rank alone (no replicas, fp32, no offload) communicates nothing: its shards are the
    // full parameters and backward accumulates in its shard gradients, unless a scaling
    // factor meets gradients kept from earlier steps (then it reduces, as more ranks do).
    const bool local = shards == 1 && !run.hsdp && !run.offload;
    const bool local_reduces = local && run.sum_with_scaling && run.zero_grad_in_place && s > 0;  // kept from step s - 1
    int64_t ag_calls = 0, ag_bytes = 0, rs_calls = 0, rs_bytes = 0;
    for (auto& u : units) {
      if (local && !local_reduces) continue;
      const bool is_root = &u == &units.back();
      const int64_t per_unit_calls = run.comm_fusion ? 1 : static_cast<int64_t>(u.unit_param_count());
      // The root keeps its parameters from its first forward to the synced backward.
      const int64_t gathers =
          local ? 0 : is_root ? 1 : (run.reshard_after_forward && run.reshard_group == 0 ? 2 : 1) * run.micro_batches;
      ag_calls += gathers * per_unit_calls;
      ag_bytes += gathers * (shards - 1) * u.sharded_numel() * 4;
      rs_calls += per_unit_calls;
      rs_bytes += (shards - 1) * u.sharded_numel() * 4;
      if (run.stray_unshard && !is_root && !local) {  // the stray gather; the next forward issues its own again
        ag_calls += per_unit_calls;
        ag_bytes += (shards - 1) * u.sharded_numel() * 4;
      }
    }
    EXPECT_EQ(step_comm[comm::CollectiveKind::kAllGather].calls, ag_calls) << "step " << s;
    EXPECT_EQ(step_comm[comm::CollectiveKind::kAllGather].bytes, ag_bytes);
    EXPECT_EQ(step_comm[comm::CollectiveKind::kReduceScatter].calls, rs_calls);
    EXPECT_EQ(step_comm[comm::CollectiveKind::kReduceScatter].bytes, rs_bytes);
    if (group_comm) {
      // Backward's all-gathers stay within the group of k: 1/k of the data from each member.
      const auto group_step = group_comm->counters() - group_before;
      const int64_t k = run.reshard_group;
      EXPECT_EQ(group_step[comm::CollectiveKind::kAllGather].calls, kLayers * run.micro_batches);
      int64_t bytes = 0;
      for (size_t i = 0; i + 1 < units.size(); ++i) bytes += (k - 1) * (shards / k) * units[i].sharded_numel() * 4;
      EXPECT_EQ(group_step[comm::CollectiveKind::kAllGather].bytes, bytes * run.micro_batches);
    }
    const int64_t ar_calls = run.replicate_norms ? kLayers : 0;  // one all-reduce per replicated parameter
    EXPECT_EQ(step_comm[comm::CollectiveKind::kAllReduce].calls, ar_calls);
    EXPECT_EQ(step_comm.total_calls(), ag_calls + rs_calls + ar_calls);
    if (replicate_comm) {
      const auto rep = replicate_comm->counters() - replicate_before;
      EXPECT_EQ(rep[comm::CollectiveKind::kAllReduce].calls, static_cast<int64_t>(units.size()));
      EXPECT_EQ(rep.total_calls(), static_cast<int64_t>(units.size()));
    }
    // Memory: the current unit, its prefetched units, and one more in backward (the root
    // keeps its own and is not counted).
    if (local) {
      EXPECT_EQ(root.max_live_unsharded_units(), 0) << "step " << s;  // no all-gather buffer at all
    } else if (s > 0 && !run.stray_unshard) {
      EXPECT_LE(root.max_live_unsharded_units(), 2 + run.prefetch_depth) << "step " << s;
      // ...and prefetching really happens: the current unit plus `depth` ahead.
      EXPECT_GE(root.max_live_unsharded_units(), std::min<int>(1 + run.prefetch_depth, kLayers)) << "step " << s;
    }
    for (auto& u : units) {
      EXPECT_EQ(u.state(), fsdp::UnitState::kSharded);
      EXPECT_EQ(u.training_state(), fsdp::TrainingState::kIdle);
    }
  }

  // Ignored and replicated parameters stay whole on every rank.
  if (run.ignore_final_norm) {
    EXPECT_EQ(model->final_norm.sizes(), (std::vector<int64_t>{kDim}));
  }
  if (run.replicate_norms) {
    for (auto& b : model->blocks) EXPECT_EQ(b->norm.sizes(), (std::vector<int64_t>{kDim}));
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
  testing::run_on_ranks(GetParam(), [](testing::RankContext& ctx) { expect_parity(ctx, {}); });
}

TEST_P(FsdpParity, MatchesOneProcessKeptAfterForward) {
  FsdpRun run;
  run.reshard_after_forward = false;
  testing::run_on_ranks(GetParam(), [&](testing::RankContext& ctx) { expect_parity(ctx, run); });
}

TEST_P(FsdpParity, MatchesOneProcessUnfused) {
  FsdpRun run;
  run.comm_fusion = false;
  testing::run_on_ranks(GetParam(), [&](testing::RankContext& ctx) { expect_parity(ctx, run); });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, FsdpParity, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(FsdpFeatures, PrefetchDepth0And2) {
  for (int depth : {0, 2}) {
    FsdpRun run;
    run.prefetch_depth = depth;
    testing::run_on_ranks(4, [&](testing::RankContext& ctx) { expect_parity(ctx, run); });
  }
}

TEST(FsdpFeatures, InjectedDelaysChangeNothing) {
  // Every collective (all-gathers, reduce-scatters, HSDP all-reduces) waits a random 0-15 ms
  // on each rank before it is issued, and each rank sleeps differently before its step.
  FsdpRun run;
  run.hsdp = true;
  run.delay_before_step_max_ms = 20;
  testing::MultiProcessOptions options;
  options.inject_delay_max_ms = 15;
  testing::run_on_ranks(4, [&](testing::RankContext& ctx) { expect_parity(ctx, run); }, options);
}

TEST(FsdpFeatures, Bf16ParamsWithFp32ReductionKeepFp32Masters) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    constexpr int kSteps = 20;
    const Trajectory reference = train_single_process(kSteps);
    auto mesh = mesh::init_device_mesh(ctx.world, "cpu", {2}, {"dp_shard"});
    auto model = make_model();
    fsdp::FullyShardOptions options;
    options.mesh = mesh;
    options.mp_policy.param_dtype = at::kBFloat16;
    options.mp_policy.reduce_dtype = at::kFloat;
    for (auto& b : model->blocks) fsdp::fully_shard(*b, options);
    options.mp_policy.output_dtype = at::kFloat;  // logits back in fp32 for the loss
    auto root = fsdp::fully_shard(*model, options);
    auto opt = make_optimizer(*model);
    double largest_gap = 0;  // bf16 compute must show: the losses are close, not equal
    for (int s = 0; s < kSteps; ++s) {
      auto [tokens, targets] = global_batch(s);
      tokens = tokens.narrow(0, ctx.rank * 6, 6);
      targets = targets.narrow(0, ctx.rank * 6, 6);
      at::Tensor logits = model->forward(tokens);
      EXPECT_EQ(logits.scalar_type(), at::kFloat);
      at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, kVocab}), targets.reshape({-1}));
      opt.zero_grad();
      loss.backward();
      opt.step();
      at::Tensor global = loss.detach().clone();
      ctx.world->all_reduce(global, comm::ReduceOp::kAvg).wait();
      EXPECT_NEAR(global.item<double>(), reference.losses[s], 1e-2 * std::abs(reference.losses[s])) << "step " << s;
      largest_gap = std::max(largest_gap, std::abs(global.item<double>() - reference.losses[s]));
    }
    EXPECT_GT(largest_gap, 1e-4) << "the bf16 run matched fp32 too well: was bf16 used at all?";
    // Between steps every parameter (and its gradient) is an fp32 master shard.
    for (const auto& p : model->parameters()) {
      EXPECT_EQ(p.scalar_type(), at::kFloat);
      EXPECT_EQ(p.grad().scalar_type(), at::kFloat);
    }
    const auto full = fsdp::full_parameters(*model);
    for (const auto& [name, want] : reference.params) {
      EXPECT_EQ(full.at(name).scalar_type(), at::kFloat);
      EXPECT_TRUE(at::allclose(full.at(name), want, 5e-2, 5e-2)) << name;
    }
  });
}

TEST(FsdpFeatures, ReshardAfterForwardToGroupsOfTwo) {
  FsdpRun run;
  run.reshard_group = 2;
  testing::run_on_ranks(4, [&](testing::RankContext& ctx) { expect_parity(ctx, run); });
}

TEST(FsdpFeatures, ShardPlacementOnDim1) {
  FsdpRun run;
  run.shard_dim1 = true;
  for (int world : {3, 4}) {
    testing::run_on_ranks(world, [&](testing::RankContext& ctx) {
      expect_parity(ctx, run);
    });
  }
}

TEST(FsdpFeatures, AListOfModulesFormsOneUnit) {
  FsdpRun run;
  run.list_unit = true;
  testing::run_on_ranks(3, [&](testing::RankContext& ctx) { expect_parity(ctx, run); });
}

TEST(FsdpFeatures, CpuOffloadStaysExact) {
  FsdpRun run;
  run.offload = true;
  testing::run_on_ranks(2, [&](testing::RankContext& ctx) { expect_parity(ctx, run); });
}

TEST(FsdpFeatures, ReplicatedAndIgnoredParameters) {
  FsdpRun run;
  run.replicate_norms = true;
  run.ignore_final_norm = true;
  testing::run_on_ranks(3, [&](testing::RankContext& ctx) { expect_parity(ctx, run); });
}

TEST(FsdpFeatures, StateDictsRoundTripAndCheckKeys) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    auto mesh = mesh::init_device_mesh(ctx.world, "cpu", {2}, {"dp_shard"});
    fsdp::FullyShardOptions options;
    options.mesh = mesh;
    auto shard_all = [&](TinyLM& m) {
      for (auto& b : m.blocks) fsdp::fully_shard(*b, options);
      fsdp::fully_shard(m, options);
    };
    // A full state dict from one process loads into a sharded model.
    const Trajectory reference = train_single_process(3);
    auto a = make_model();
    shard_all(*a);
    fsdp::load_full_state_dict(*a, reference.params);
    for (const auto& [name, t] : fsdp::full_state_dict(*a)) {
      EXPECT_TRUE(at::equal(t, reference.params.at(name))) << name;
    }
    // Sharded: save from one model, load into a fresh one with the same layout.
    auto sharded = fsdp::sharded_state_dict(*a);
    EXPECT_EQ(sharded.at("layers0.fc1.weight").global_shape, (std::vector<int64_t>{kHidden, kDim}));
    EXPECT_EQ(sharded.at("layers0.fc1.weight").row_offset, ctx.rank * 20);
    EXPECT_EQ(sharded.at("layers0.fc1.weight").local.size(0), 20);
    auto b = make_model();
    shard_all(*b);
    fsdp::load_sharded_state_dict(*b, sharded);
    const auto full_b = fsdp::full_state_dict(*b, /*rank0_only=*/true);
    if (ctx.rank == 0) {
      for (const auto& [name, t] : full_b) EXPECT_TRUE(at::equal(t, reference.params.at(name))) << name;
    } else {
      EXPECT_TRUE(full_b.empty());
    }
    // Wrong keys and shapes are named, and nothing is loaded.
    auto bad = reference.params;
    bad.erase("embed.weight");
    bad["extra"] = at::zeros({1});
    try {
      fsdp::load_full_state_dict(*b, bad);
      ADD_FAILURE() << "no error for bad keys";
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()), "state dict does not match the model: missing keys [embed.weight], unexpected keys [extra]");
    }
    auto wrong_shape = reference.params;
    wrong_shape["final_norm"] = at::zeros({3});
    EXPECT_THROW(fsdp::load_full_state_dict(*b, wrong_shape), UserError);
    for (const auto& [name, t] : fsdp::full_state_dict(*b)) EXPECT_TRUE(at::equal(t, reference.params.at(name))) << name;
  });
}

// An unshard() issued and never waited for must not bring the parameters of before an
// optimizer step into the next forward; gradients must not depend on zero_grad zeroing in
// place (LibTorch 2.x sets them to none).
TEST(FsdpFeatures, AStrayUnshardBeforeTheStepAndGradientsSetToNoneChangeNothing) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    {
      SCOPED_TRACE("stray unshard");
      FsdpRun stray;
      stray.stray_unshard = true;
      expect_parity(ctx, stray);
    }
    SCOPED_TRACE("gradients set to none");
    FsdpRun none;
    none.grads_set_to_none = true;
    expect_parity(ctx, none);
  });
}

TEST(FsdpFeatures, HsdpTwoByTwo) {
  FsdpRun run;
  run.hsdp = true;
  testing::run_on_ranks(4, [&](testing::RankContext& ctx) { expect_parity(ctx, run); });
}

TEST(FsdpFeatures, GradientAccumulationOverFourMicroBatches) {
  FsdpRun run;
  run.micro_batches = 4;  // 12 sequences / 3 ranks = 4 per rank, one per micro-batch
  testing::run_on_ranks(3, [&](testing::RankContext& ctx) { expect_parity(ctx, run); });
}

TEST(FsdpFeatures, SumWithScalingFactorEqualsAvg) {
  FsdpRun run;
  run.sum_with_scaling = true;
  testing::run_on_ranks(2, [&](testing::RankContext& ctx) { expect_parity(ctx, run); });
}

// zero_grad(false) keeps the shard gradients: the reduction lands in a buffer of its own and
// is added to them (with set-to-none it writes into them directly).
TEST(FsdpFeatures, GradientsZeroedInPlaceAccumulateOverMicroBatches) {
  FsdpRun run;
  run.zero_grad_in_place = true;
  run.micro_batches = 2;
  testing::run_on_ranks(3, [&](testing::RankContext& ctx) { expect_parity(ctx, run); });
}

// One rank: gradients accumulate in the shard gradients over micro-batches, scaled or not; a
// scaling factor with gradients kept from earlier steps takes the reducing path instead.
TEST(FsdpFeatures, OneRankAccumulatesInItsShards) {
  testing::run_on_ranks(1, [](testing::RankContext& ctx) {
    for (const bool in_place : {false, true}) {
      SCOPED_TRACE(in_place ? "zero_grad(false)" : "set to none");
      FsdpRun run;
      run.micro_batches = 3;
      run.sum_with_scaling = true;
      run.zero_grad_in_place = in_place;
      expect_parity(ctx, run);
    }
  });
}

}  // namespace
}  // namespace hyperparallel
