// Tensor parallelism at the library level: the shipped plans on Llama, Qwen2 and Qwen3 debug
// flavours train like a plain unsharded model (same seed, same global batch), per layout:
// TP2, TP2+SP on 2 ranks; TP4 (GQA with tp > kv heads), TP4+SP, FSDP2 x TP2+SP and
// HSDP (2, 1) x TP2 on 4 ranks; the collectives of a step are counted; bad plans, degrees and
// meshes are UserErrors.
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include "hyperparallel/dtensor/dtensor.h"
#include "hyperparallel/fsdp/clip_grad_norm.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/tp/loss_parallel.h"
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

// A layout of the ranks: (dp_replicate, dp_shard, tp); FSDP when dp > 1, HSDP when both.
struct Layout {
  int64_t dp_replicate = 1, dp_shard = 1, tp = 1;
  bool sequence_parallel = false, loss_parallel = false;
  std::string name() const {
    return "dp_replicate " + std::to_string(dp_replicate) + " x dp_shard " + std::to_string(dp_shard) + " x tp " +
           std::to_string(tp) + (sequence_parallel ? " +sp" : "") + (loss_parallel ? " +loss parallel" : "");
  }
  tp::TensorParallelOptions options() const {
    tp::TensorParallelOptions o;
    o.sequence_parallel = sequence_parallel;
    o.loss_parallel = loss_parallel;
    return o;
  }
};

// A debug flavour, or one of two variants: "llama-debug-bias" (biases on q/k/v, o_proj and the
// MLP, so row-parallel biases meet sequence parallelism) and "llama-debug-vocab6" (6 tokens:
// at tp 4 one vocab shard is empty).
std::shared_ptr<models::CausalLM> make_model(const std::string& flavour) {
  models::ModelLoadOptions options;
  options.seed = 11;
  if (flavour == "llama-debug-bias" || flavour == "llama-debug-vocab6") {
    models::ModelConfig c = models::debug_flavour_config("llama-debug");
    if (flavour == "llama-debug-bias") c.attention_bias = c.mlp_bias = true;
    if (flavour == "llama-debug-vocab6") c.vocab_size = 6;
    return models::AutoModelForCausalLM::from_config(c, options);
  }
  return models::AutoModelForCausalLM::from_pretrained(flavour, options);
}

// SGD with momentum on two alternating batches (a loss that falls); tp ranks share a batch,
// dp ranks take their rows of it. No context: the plain model in this process.
Trained train(const std::string& flavour, const testing::RankContext* ctx, const Layout& layout, int steps) {
  auto model = make_model(flavour);
  std::unique_ptr<mesh::DeviceMesh> mesh;
  int64_t dp = 1, dp_rank = 0;
  const bool fsdp = ctx && layout.dp_replicate * layout.dp_shard > 1;
  if (ctx) {
    mesh = std::make_unique<mesh::DeviceMesh>(mesh::init_device_mesh(
        ctx->world, "cpu", {layout.dp_replicate, layout.dp_shard, layout.tp}, {"dp_replicate", "dp_shard", "tp"}));
    const auto c = mesh->coordinates();
    dp = layout.dp_replicate * layout.dp_shard;
    dp_rank = c[0] * layout.dp_shard + c[1];
    if (layout.tp > 1) {
      tp::parallelize_module(*model, (*mesh)["tp"], tp::plan_for(model->config(), layout.tp, layout.options()));
      if (layout.loss_parallel) tp::enable_loss_parallel(*model, (*mesh)["tp"]);
    }
    if (fsdp) {
      fsdp::FullyShardOptions shard;
      shard.mesh = layout.dp_replicate > 1 ? (*mesh)[{"dp_replicate", "dp_shard"}] : (*mesh)["dp_shard"];
      for (auto* layer : model->decoder_layers()) fsdp::fully_shard(*layer, shard);
      fsdp::fully_shard(*model, shard);
    }
  }
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
  Trained result;
  for (int s = 0; s < steps; ++s) {
    auto gen = at::detail::createCPUGenerator(100 + s % 2);
    const at::Tensor ids = at::randint(model->config().vocab_size, {kBatch, kSeq}, gen, at::kLong);
    models::CausalLMInput in;
    in.input_ids = ids.narrow(0, dp_rank * kBatch / dp, kBatch / dp);
    in.labels = in.input_ids;
    if (mesh) mesh->comm("tp")->reset_counters();
    auto out = model->forward(in);
    opt.zero_grad();
    out.loss.backward();
    if (mesh) result.last_step = mesh->comm("tp")->counters();
    opt.step();
    at::Tensor loss = out.loss.detach().clone();  // equal token counts per dp rank: the mean of means
    if (ctx) ctx->world->all_reduce(loss, comm::ReduceOp::kAvg).wait();
    result.losses.push_back(loss.item<double>());
  }
  result.params = fsdp::full_state_dict(*model);  // FSDP units gathered over dp, TP pieces over tp (parameter specs)
  return result;
}

void expect_matches_one_process(const testing::RankContext& ctx, const Layout& layout, int steps,
                                const std::vector<std::string>& flavours = {"llama-debug", "qwen2-debug", "qwen3-debug"}) {
  for (const std::string& flavour : flavours) {
    SCOPED_TRACE(flavour + " " + layout.name());
    const Trained ref = train(flavour, nullptr, {}, steps);
    const Trained got = train(flavour, &ctx, layout, steps);
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

Layout tp_only(int64_t tp, bool sp, bool lp = false) {
  Layout l;
  l.tp = tp;
  l.sequence_parallel = sp;
  l.loss_parallel = lp;
  return l;
}

TEST(TensorParallel, Tp2AndTp2WithSequenceParallelTrainLikeOneProcess) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    expect_matches_one_process(ctx, tp_only(2, false), 20);
    expect_matches_one_process(ctx, tp_only(2, true), 20);
  });
}

TEST(TensorParallel, Tp2WithLossParallelTrainsLikeOneProcess) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    expect_matches_one_process(ctx, tp_only(2, false, true), 20);
    expect_matches_one_process(ctx, tp_only(2, true, true), 20);
    // Row-parallel biases on a sequence-sharded output: their gradient is summed over tp.
    expect_matches_one_process(ctx, tp_only(2, true, true), 20, {"llama-debug-bias"});
  });
}

TEST(TensorParallelWide, Tp4AndTp4WithSequenceParallelTrainLikeOneProcess) {
  testing::MultiProcessOptions options;
  options.time_limit = std::chrono::seconds(300);
  testing::run_on_ranks(4, [](testing::RankContext& ctx) {
    expect_matches_one_process(ctx, tp_only(4, false), 20);  // 2 kv heads < 4 ranks: ReplicatedKvHeads
    expect_matches_one_process(ctx, tp_only(4, true), 20);
    // 6 tokens over 4 ranks: the last vocab shard (embedding and head) is empty.
    expect_matches_one_process(ctx, tp_only(4, true, true), 20, {"llama-debug-vocab6"});
  }, options);
}

// TP applied first, then FSDP over the dp axes of the same mesh (TP shards sharded again).
TEST(TensorParallelWide, FsdpAndHsdpOverTp2TrainLikeOneProcess) {
  testing::MultiProcessOptions options;
  options.time_limit = std::chrono::seconds(300);
  testing::run_on_ranks(4, [](testing::RankContext& ctx) {
    Layout fsdp_tp = tp_only(2, true, true);
    fsdp_tp.dp_shard = 2;
    expect_matches_one_process(ctx, fsdp_tp, 20);
    Layout hsdp_tp = tp_only(2, false);
    hsdp_tp.dp_replicate = 2;
    expect_matches_one_process(ctx, hsdp_tp, 20);
  }, options);
}

// One backward of the global batch; returns the global gradient norm (the plain model's own
// without a context).
double gradient_norm(const std::string& flavour, const testing::RankContext* ctx, const Layout& layout) {
  auto model = make_model(flavour);
  int64_t dp = 1, dp_rank = 0;
  if (ctx) {
    auto mesh = mesh::init_device_mesh(ctx->world, "cpu", {layout.dp_replicate, layout.dp_shard, layout.tp},
                                       {"dp_replicate", "dp_shard", "tp"});
    dp = layout.dp_replicate * layout.dp_shard;
    dp_rank = mesh.coordinates()[0] * layout.dp_shard + mesh.coordinates()[1];
    tp::parallelize_module(*model, mesh["tp"], tp::plan_for(model->config(), layout.tp, layout.options()));
    if (layout.loss_parallel) tp::enable_loss_parallel(*model, mesh["tp"]);
    fsdp::FullyShardOptions shard;
    shard.mesh = layout.dp_replicate > 1 ? mesh[{"dp_replicate", "dp_shard"}] : mesh["dp_shard"];
    for (auto* layer : model->decoder_layers()) fsdp::fully_shard(*layer, shard);
    fsdp::fully_shard(*model, shard);
  }
  auto gen = at::detail::createCPUGenerator(100);
  const at::Tensor ids = at::randint(model->config().vocab_size, {kBatch, kSeq}, gen, at::kLong);
  models::CausalLMInput in;
  in.input_ids = ids.narrow(0, dp_rank * kBatch / dp, kBatch / dp);
  in.labels = in.input_ids;
  model->forward(in).loss.backward();
  if (!ctx) {
    double sq = 0;
    for (const auto& p : model->parameters()) sq += p.grad().pow(2).sum().item<double>();
    return std::sqrt(sq);
  }
  return fsdp::clip_grad_norm_(*model, 0.0, *ctx->world);
}

TEST(TensorParallel, ClipGradNormCountsEveryPieceOnce) {
  testing::run_on_ranks(4, [](testing::RankContext& ctx) {
    for (const std::string flavour : {"llama-debug", "qwen3-debug"}) {
      const double want = gradient_norm(flavour, nullptr, {});
      Layout fsdp_tp = tp_only(2, true);
      fsdp_tp.dp_shard = 2;
      Layout hsdp_tp = tp_only(2, false);
      hsdp_tp.dp_replicate = 2;
      for (const Layout& layout : {fsdp_tp, hsdp_tp, tp_only(4, false)}) {
        EXPECT_NEAR(gradient_norm(flavour, &ctx, layout), want, 1e-5 * want) << flavour << " " << layout.name();
      }
    }
  });
}

// Qwen3-MoE: attention split over tp, the sparse blocks whole on every tp rank (the router's
// aux loss then sees the whole batch, as one process does).
TEST(TensorParallel, Qwen3MoeDensePartsTrainLikeOneProcess) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    for (const Layout& layout : {tp_only(2, false), tp_only(2, true, true)}) {
      SCOPED_TRACE(layout.name());
      const Trained ref = train("qwen3-moe-debug", nullptr, {}, 10);
      const Trained got = train("qwen3-moe-debug", &ctx, layout, 10);
      for (int s = 0; s < 10; ++s) EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::abs(ref.losses[s])) << "step " << s;
      for (const auto& [name, p] : ref.params) {
        const double scale = std::max(1e-12, p.abs().max().item<double>());
        EXPECT_LE((got.params.at(name) - p).abs().max().item<double>(), 1e-5 * scale) << name;
      }
    }
  });
}

TEST(TensorParallel, FullyShardRefusesAMeshWithATpAxis) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    auto model = models::AutoModelForCausalLM::from_pretrained("llama-debug", {});
    fsdp::FullyShardOptions shard;
    shard.mesh = mesh::init_device_mesh(ctx.world, "cpu", {1, 2}, {"dp_shard", "tp"});
    try {
      fsdp::fully_shard(*model, shard);
      ADD_FAILURE() << "no error";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("has the model-parallel axis 'tp'; pass the data-parallel sub-mesh"), std::string::npos)
          << e.what();
    }
  });
}

// Megatron's count: per block one all-reduce forward (row-parallel output) and one backward
// (the block input's gradient); the vocab-parallel embedding one more forward. With SP each
// of those is an all-gather + reduce-scatter pair, plus the norms' weight gradients.
TEST(TensorParallel, EachBlockCommunicatesOnceEachWay) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    using comm::CollectiveKind;
    const int64_t layers = 4, hidden = 128, tokens = kBatch * kSeq, n = 2;
    const Trained plain = train("llama-debug", &ctx, tp_only(2, false), 1);
    EXPECT_EQ(plain.last_step[CollectiveKind::kAllReduce].calls, 4 * layers + 1);
    EXPECT_EQ(plain.last_step.total_calls(), 4 * layers + 1);
    const int64_t activation_bytes = 2 * (n - 1) * (tokens * hidden / n) * 4;  // ring all-reduce of [B, T, H] fp32
    EXPECT_EQ(plain.last_step[CollectiveKind::kAllReduce].bytes, (4 * layers + 1) * activation_bytes);

    const Trained sp = train("llama-debug", &ctx, tp_only(2, true), 1);
    // Forward: 2 gathers + 2 scatters per layer, the embedding's scatter, the final norm's
    // gather; backward mirrors each (the final gather's dual is a slice).
    EXPECT_EQ(sp.last_step[CollectiveKind::kAllGather].calls, 2 * layers + 1 + 2 * layers + 1);
    EXPECT_EQ(sp.last_step[CollectiveKind::kReduceScatter].calls, 2 * layers + 1 + 2 * layers);
    EXPECT_EQ(sp.last_step[CollectiveKind::kAllReduce].calls, 2 * layers + 1);  // norm weights
    // A sequence shard is ceil(15 / 2) = 8 positions of [4, 8, 128] fp32.
    const int64_t shard_bytes = kBatch * 8 * hidden * 4;
    EXPECT_EQ(sp.last_step[CollectiveKind::kAllGather].bytes, (4 * layers + 2) * (n - 1) * shard_bytes);
    EXPECT_EQ(sp.last_step[CollectiveKind::kReduceScatter].bytes, (4 * layers + 1) * (n - 1) * shard_bytes);

    // Loss parallel: no logits move. The final norm's gather now reduce-scatters in backward;
    // the loss adds three all-reduces of one float per token (max, sum of exp, label logit).
    const Trained lp = train("llama-debug", &ctx, tp_only(2, true, true), 1);
    EXPECT_EQ(lp.last_step[CollectiveKind::kAllGather].bytes, (4 * layers + 2) * (n - 1) * shard_bytes);
    EXPECT_EQ(lp.last_step[CollectiveKind::kReduceScatter].calls, 4 * layers + 2);
    EXPECT_EQ(lp.last_step[CollectiveKind::kAllReduce].calls, 2 * layers + 1 + 3);
    const int64_t token_floats = 2 * (n - 1) * (tokens / n) * 4;
    EXPECT_EQ(lp.last_step[CollectiveKind::kAllReduce].bytes - sp.last_step[CollectiveKind::kAllReduce].bytes, 3 * token_floats);
    EXPECT_EQ(lp.last_step.total_calls(), (4 * layers + 2) + (4 * layers + 2) + (2 * layers + 4));
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
