// Tensor parallelism at the library level: the shipped plans on Llama, Qwen2 and Qwen3 debug
// flavours train like a plain unsharded model (same seed, same batch on every tp rank), per
// layout: TP2, TP2+SP on 2 ranks, TP4 (GQA with tp > kv heads), TP4+SP on 4 ranks; the
// collectives of a step are counted; bad plans and degrees are UserErrors.
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include "hyperparallel/dtensor/dtensor.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/tp/model_plans.h"
#include "support/multiprocess.h"

namespace hyperparallel {
namespace {

constexpr int64_t kBatch = 4, kSeq = 15;  // odd: uneven sequence shards under SP

struct Trained {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;  // whole tensors
  comm::CommCounters last_step;              // tp group, one step
};

std::map<std::string, at::Tensor> gathered_parameters(models::CausalLM& model, const mesh::DeviceMesh* tp_mesh,
                                                      const tp::ParameterLayouts& layouts) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_parameters()) {
    at::Tensor p = item.value().detach();
    const auto it = layouts.find(item.key());
    if (tp_mesh && it != layouts.end() && it->second.placements()[0].is_shard()) {
      p = dtensor::DTensor(p, it->second).full_tensor();
    }
    out[item.key()] = p.clone();
  }
  return out;
}

// SGD with momentum on a fixed sequence of batches; every tp rank sees the whole batch.
Trained train(const std::string& flavour, const testing::RankContext* ctx, bool sequence_parallel, int steps) {
  models::ModelLoadOptions options;
  options.seed = 11;
  auto model = models::AutoModelForCausalLM::from_pretrained(flavour, options);
  std::unique_ptr<mesh::DeviceMesh> tp_mesh;
  tp::ParameterLayouts layouts;
  if (ctx) {
    tp_mesh = std::make_unique<mesh::DeviceMesh>(mesh::init_device_mesh(ctx->world, "cpu", {ctx->world_size}, {"tp"}));
    layouts = tp::parallelize_module(*model, *tp_mesh, tp::plan_for(model->config(), ctx->world_size, {sequence_parallel}));
  }
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
  Trained result;
  for (int s = 0; s < steps; ++s) {
    auto gen = at::detail::createCPUGenerator(100 + s % 2);  // two batches, alternating: a loss that falls
    models::CausalLMInput in;
    in.input_ids = at::randint(model->config().vocab_size, {kBatch, kSeq}, gen, at::kLong);
    in.labels = in.input_ids;
    if (tp_mesh) tp_mesh->comm("tp")->reset_counters();
    auto out = model->forward(in);
    opt.zero_grad();
    out.loss.backward();
    if (tp_mesh) result.last_step = tp_mesh->comm("tp")->counters();
    opt.step();
    result.losses.push_back(out.loss.item<double>());
  }
  result.params = gathered_parameters(*model, tp_mesh.get(), layouts);
  return result;
}

void expect_matches_one_process(const testing::RankContext& ctx, bool sequence_parallel, int steps) {
  for (const std::string flavour : {"llama-debug", "qwen2-debug", "qwen3-debug"}) {
    SCOPED_TRACE(flavour + " tp" + std::to_string(ctx.world_size) + (sequence_parallel ? "+sp" : ""));
    const Trained ref = train(flavour, nullptr, false, steps);
    const Trained got = train(flavour, &ctx, sequence_parallel, steps);
    for (int s = 0; s < steps; ++s) EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::abs(ref.losses[s])) << "step " << s;
    EXPECT_LT(ref.losses.back(), ref.losses.front());  // it trains
    for (const auto& [name, p] : ref.params) {
      const at::Tensor& q = got.params.at(name);
      ASSERT_EQ(q.sizes(), p.sizes()) << name;
      const double scale = std::max(1e-12, p.abs().max().item<double>());
      EXPECT_LE((q - p).abs().max().item<double>(), 1e-5 * scale) << name;
    }
  }
}

TEST(TensorParallel, Tp2AndTp2WithSequenceParallelTrainLikeOneProcess) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    expect_matches_one_process(ctx, false, 20);
    expect_matches_one_process(ctx, true, 20);
  });
}

TEST(TensorParallel, Tp4AndTp4WithSequenceParallelTrainLikeOneProcess) {
  testing::MultiProcessOptions options;
  options.time_limit = std::chrono::seconds(300);
  testing::run_on_ranks(4, [](testing::RankContext& ctx) {
    expect_matches_one_process(ctx, false, 20);  // 2 kv heads < 4 ranks: ReplicatedKvHeads
    expect_matches_one_process(ctx, true, 20);
  }, options);
}

// Megatron's count: per block one all-reduce forward (row-parallel output) and one backward
// (the block input's gradient); the vocab-parallel embedding one more forward. With SP each
// of those is an all-gather + reduce-scatter pair, plus the norms' weight gradients.
TEST(TensorParallel, EachBlockCommunicatesOnceEachWay) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    using comm::CollectiveKind;
    const int64_t layers = 4, hidden = 128, tokens = kBatch * kSeq, n = 2;
    const Trained plain = train("llama-debug", &ctx, false, 1);
    EXPECT_EQ(plain.last_step[CollectiveKind::kAllReduce].calls, 4 * layers + 1);
    EXPECT_EQ(plain.last_step.total_calls(), 4 * layers + 1);
    const int64_t activation_bytes = 2 * (n - 1) * (tokens * hidden / n) * 4;  // ring all-reduce of [B, T, H] fp32
    EXPECT_EQ(plain.last_step[CollectiveKind::kAllReduce].bytes, (4 * layers + 1) * activation_bytes);

    const Trained sp = train("llama-debug", &ctx, true, 1);
    // Forward: 2 gathers + 2 scatters per layer, the embedding's scatter, the final norm's
    // gather; backward mirrors each (the final gather's dual is a slice).
    EXPECT_EQ(sp.last_step[CollectiveKind::kAllGather].calls, 2 * layers + 1 + 2 * layers + 1);
    EXPECT_EQ(sp.last_step[CollectiveKind::kReduceScatter].calls, 2 * layers + 1 + 2 * layers);
    EXPECT_EQ(sp.last_step[CollectiveKind::kAllReduce].calls, 2 * layers + 1);  // norm weights
    // A sequence shard is ceil(15 / 2) = 8 positions of [4, 8, 128] fp32.
    const int64_t shard_bytes = kBatch * 8 * hidden * 4;
    EXPECT_EQ(sp.last_step[CollectiveKind::kAllGather].bytes, (4 * layers + 2) * (n - 1) * shard_bytes);
    EXPECT_EQ(sp.last_step[CollectiveKind::kReduceScatter].bytes, (4 * layers + 1) * (n - 1) * shard_bytes);
  });
}

std::string user_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

TEST(TensorParallelPlans, DegreesThatDoNotFitTheHeadsAreUserErrorsWithTheValidOnes) {
  const auto config = models::debug_flavour_config("llama-debug");  // 4 heads, 2 kv heads
  const std::string e = user_error_of([&] { tp::plan_for(config, 3); });
  EXPECT_NE(e.find("num_attention_heads (4) must divide by it"), std::string::npos) << e;
  EXPECT_NE(e.find("valid tp sizes: 1, 2, 4"), std::string::npos) << e;
  const std::string moe = user_error_of([&] { tp::plan_for(models::debug_flavour_config("qwen3-moe-debug"), 2); });
  EXPECT_NE(moe.find("come with expert parallelism"), std::string::npos) << moe;
}

TEST(TensorParallelPlans, APatternThatMatchesNothingOrTheWrongModuleIsAUserError) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    auto model = models::AutoModelForCausalLM::from_pretrained("llama-debug", {});
    const auto mesh = mesh::init_device_mesh(ctx.world, "cpu", {2}, {"tp"});
    tp::ParallelizePlan typo;
    typo.add("model.layers.*.self_atn.q_proj", tp::ColwiseParallel{});
    std::string e = user_error_of([&] { tp::parallelize_module(*model, mesh, typo); });
    EXPECT_NE(e.find("'model.layers.*.self_atn.q_proj' (ColwiseParallel) matches no module"), std::string::npos) << e;
    tp::ParallelizePlan wrong;
    wrong.add("model.layers.0.self_attn", tp::ColwiseParallel{});
    e = user_error_of([&] { tp::parallelize_module(*model, mesh, wrong); });
    EXPECT_NE(e.find("ColwiseParallel applies to Linear modules, but 'model.layers.0.self_attn' is a"), std::string::npos) << e;
  });
}

}  // namespace
}  // namespace hyperparallel
