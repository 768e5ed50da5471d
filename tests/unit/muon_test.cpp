// Muon: Newton–Schulz against its definition, one step against the formula, and training on
// real processes under FSDP4, HSDP 2x2 and FSDP2 x TP2 against a one-process Muon (losses,
// gradient norms and every Muon matrix); the matrices it takes and its option errors.
#include <gtest/gtest.h>

#include "hyperparallel/fsdp/clip_grad_norm.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/optim/muon.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/tp/model_plans.h"
#include "support/multiprocess.h"
#include "support/parity_run.h"

namespace hyperparallel {
namespace {

TEST(Optimizers, NewtonSchulzIsTheQuinticIterationOnTheNormalisedMatrix) {
  auto gen = at::detail::createCPUGenerator(5);
  for (const auto& shape : std::vector<std::vector<int64_t>>{{12, 30}, {30, 12}}) {
    const at::Tensor u = at::randn(shape, gen);
    at::Tensor x = shape[0] > shape[1] ? u.t() : u;
    x = x / (x.norm() + 1e-7);
    for (int k = 0; k < 5; ++k) {
      const at::Tensor a = at::mm(x, x.t());
      x = 3.4445 * x + at::mm(-4.7750 * a + 2.0315 * at::mm(a, a), x);
    }
    if (shape[0] > shape[1]) x = x.t();
    const at::Tensor o = optim::newton_schulz(u, 5);
    EXPECT_EQ(o.sizes(), u.sizes());
    EXPECT_TRUE(at::allclose(o, x, 1e-6, 1e-7));
    // Nearly orthogonal: the singular values land in about [0.6, 1.2] after five steps.
    const at::Tensor sv = at::linalg_svdvals(o);
    EXPECT_GT(sv.min().item<double>(), 0.5);
    EXPECT_LT(sv.max().item<double>(), 1.3);
  }
}

// A toy root with a matrix (Muon) and a bias (AdamW).
struct Toy : torch::nn::Module {
  Toy() {
    weight = register_parameter("weight", at::randn({6, 4}, at::detail::createCPUGenerator(1)));
    bias = register_parameter("bias", at::zeros({6}));
  }
  at::Tensor weight, bias;
};

TEST(Optimizers, OneMuonStepIsTheFormula) {
  auto owned = std::make_shared<Toy>();
  Toy& toy = *owned;
  optim::MuonOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.weight_decay = 0.05;
  std::vector<torch::optim::OptimizerParamGroup> adamw;
  adamw.emplace_back(std::vector<at::Tensor>{toy.bias}, std::make_unique<torch::optim::AdamWOptions>(1e-3));
  optim::Muon muon(std::move(adamw), torch::optim::AdamWOptions(1e-3), toy, o, nullptr);
  EXPECT_EQ(muon.matrix_count(), 1u);
  const at::Tensor w0 = toy.weight.detach().clone();
  at::Tensor buffer = at::zeros_like(w0);
  at::Tensor w = w0.clone();
  for (int step = 0; step < 3; ++step) {
    const at::Tensor g = at::randn({6, 4}, at::detail::createCPUGenerator(10 + step));
    toy.weight.mutable_grad() = g.clone();
    toy.bias.mutable_grad() = at::ones({6});
    muon.step();
    buffer = buffer.lerp(g, 1 - o.momentum);
    const at::Tensor u = g.lerp(buffer, o.momentum);  // nesterov
    w = w * (1 - o.lr * o.weight_decay) - o.lr * 0.2 * std::sqrt(6.0) * optim::newton_schulz(u, 5);
    EXPECT_TRUE(at::allclose(toy.weight.detach(), w, 1e-6, 1e-7)) << "step " << step;
  }
  EXPECT_LT(toy.bias[0].item<double>(), 0);  // AdamW moved the bias against its gradient
}

// offload_state streams Muon's buffers and the AdamW moments through the file: bit-identical.
TEST(Optimizers, MuonWithOffloadedStateIsBitIdentical) {
  std::vector<std::map<std::string, at::Tensor>> results;
  for (bool offload : {false, true}) {
    models::ModelLoadOptions load;
    load.seed = 4;
    auto model = models::AutoModelForCausalLM::from_pretrained("qwen3-debug", load);
    std::vector<at::Tensor> others;
    for (const auto& item : model->named_parameters()) {
      if (!optim::takes_muon(item.key(), item.value().sizes().vec())) others.push_back(item.value());
    }
    std::vector<torch::optim::OptimizerParamGroup> adamw;
    adamw.emplace_back(others, std::make_unique<torch::optim::AdamWOptions>(1e-3));
    optim::Muon opt(std::move(adamw), torch::optim::AdamWOptions(1e-3), *model, {}, nullptr);
    if (offload) opt.offload_state(::testing::TempDir());
    for (int step = 0; step < 4; ++step) {
      models::CausalLMInput in;
      in.input_ids = at::randint(64, {2, 12}, at::detail::createCPUGenerator(60 + step), at::kLong);
      in.labels = in.input_ids;
      opt.zero_grad();
      model->forward(in).loss.backward();
      opt.step();
    }
    if (offload) {
      EXPECT_GT(opt.state_file()->released_bytes(), 0u);
    }
    std::map<std::string, at::Tensor> params;
    for (const auto& item : model->named_parameters()) params[item.key()] = item.value().detach().clone();
    results.push_back(params);
  }
  for (const auto& [name, p] : results[0]) EXPECT_TRUE(p.equal(results[1].at(name))) << name;
}

TEST(Optimizers, MuonTakesMatricesButNotEmbeddingsOrTheHead) {
  EXPECT_TRUE(optim::takes_muon("model.layers.0.self_attn.q_proj.weight", {64, 128}));
  EXPECT_TRUE(optim::takes_muon("model.layers.0.mlp.experts.3.down_proj.weight", {128, 64}));
  EXPECT_FALSE(optim::takes_muon("model.embed_tokens.weight", {512, 128}));
  EXPECT_FALSE(optim::takes_muon("lm_head.weight", {512, 128}));
  EXPECT_FALSE(optim::takes_muon("model.norm.weight", {128}));
  EXPECT_FALSE(optim::takes_muon("model.layers.0.self_attn.q_proj.bias", {64}));
  auto owned = std::make_shared<Toy>();
  Toy& toy = *owned;
  const auto error = [&](optim::MuonOptions o) {
    std::vector<torch::optim::OptimizerParamGroup> adamw;
    adamw.emplace_back(std::vector<at::Tensor>{toy.bias}, std::make_unique<torch::optim::AdamWOptions>(1e-3));
    try {
      optim::Muon muon(std::move(adamw), torch::optim::AdamWOptions(1e-3), toy, o, nullptr);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  optim::MuonOptions bad;
  bad.momentum = 1.0;
  EXPECT_NE(error(bad).find("muon_config.momentum must be in [0, 1)"), std::string::npos);
  bad = {};
  bad.ns_steps = 0;
  EXPECT_NE(error(bad).find("muon_config.ns_steps must be >= 1"), std::string::npos);
  bad = {};
  bad.adjust_lr = "rms";
  EXPECT_NE(error(bad).find("adjust_lr 'rms' is not one of: match_rms_adamw, original"), std::string::npos);
}

// How a run is laid out: `tp` ranks per tensor-parallel group, `replicas` HSDP groups.
struct Layout {
  int world = 1, tp = 1, replicas = 1;
};

constexpr int64_t kRows = 8, kSeq = 16, kSteps = 10;

testing::ParityRun train(const testing::RankContext* ctx, const Layout& l) {
  models::ModelLoadOptions load;
  load.seed = 9;
  auto model = models::AutoModelForCausalLM::from_pretrained("qwen3-debug", load);
  const int dp = l.world / l.tp;
  int64_t dp_rank = 0;
  if (ctx) {
    const mesh::DeviceMesh mesh = mesh::init_device_mesh(ctx->world, "cpu", {l.replicas, dp / l.replicas, l.tp},
                                                         {"dp_replicate", "dp_shard", "tp"});
    if (l.tp > 1) tp::parallelize_module(*model, mesh["tp"], tp::plan_for(model->config(), l.tp));
    fsdp::FullyShardOptions shard;
    shard.mesh = l.replicas > 1 ? mesh[{"dp_replicate", "dp_shard"}] : mesh["dp_shard"];
    for (auto* layer : model->decoder_layers()) fsdp::fully_shard(*layer, shard);
    fsdp::fully_shard(*model, shard).set_reduce_op_type("sum");
    dp_rank = mesh.local_rank("dp_replicate") * (dp / l.replicas) + mesh.local_rank("dp_shard");
  }
  std::vector<at::Tensor> others;
  for (const auto& item : model->named_parameters()) {
    const auto shapes = fsdp::full_parameter_shapes(*model);
    if (!optim::takes_muon(item.key(), shapes.at(item.key()))) others.push_back(item.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> adamw;
  adamw.emplace_back(others, std::make_unique<torch::optim::AdamWOptions>(2e-3));
  optim::MuonOptions muon_options;
  muon_options.lr = 2e-3;
  optim::Muon opt(std::move(adamw), torch::optim::AdamWOptions(2e-3), *model, muon_options, ctx ? ctx->world : nullptr);
  testing::ParityRun run;
  for (int s = 0; s < kSteps; ++s) {
    const at::Tensor ids = at::randint(64, {kRows, kSeq}, at::detail::createCPUGenerator(40 + s), at::kLong);
    models::CausalLMInput in;
    in.input_ids = ctx ? ids.narrow(0, dp_rank * (kRows / dp), kRows / dp) : ids;
    in.labels = in.input_ids;
    const double count = static_cast<double>(kRows * (kSeq - 1));
    opt.zero_grad();
    const auto out = model->forward(in);
    (out.lm_loss_sum / count).backward();
    testing::record_step(run, ctx, *model, out.lm_loss_sum / count, static_cast<double>(l.tp));
    opt.step();
  }
  testing::record_parameters(run, ctx, *model);
  return run;
}

void expect_matches_one_process(testing::RankContext& ctx, const Layout& l) {
  SCOPED_TRACE("tp " + std::to_string(l.tp) + " replicas " + std::to_string(l.replicas));
  const testing::ParityRun ref = train(nullptr, l), got = train(&ctx, l);
  EXPECT_LT(ref.losses.back(), ref.losses.front());
  // Every Muon matrix (AdamW's parameters amplify rounding where gradients are tiny: Adam
  // divides by their RMS; the losses and gradient norms cover them).
  size_t matrices = 0;
  testing::expect_same_training(ref, got, 1e-5, [&](const std::string& name) {
    const bool muon = optim::takes_muon(name, ref.params.at(name).sizes().vec());
    matrices += muon;
    return muon;
  });
  EXPECT_EQ(matrices, 28u);  // 4 layers x (q, k, v, o, gate, up, down)
}

TEST(Optimizers, MuonUnderFsdpAndTensorParallelismEqualsOneProcess) {
  testing::run_on_ranks(4, [](testing::RankContext& ctx) {
    expect_matches_one_process(ctx, Layout{4, 1, 1});  // FSDP4
    expect_matches_one_process(ctx, Layout{4, 1, 2});  // HSDP: replicas send their boxes once
    expect_matches_one_process(ctx, Layout{4, 2, 1});  // FSDP2 x TP2
  });
}

}  // namespace
}  // namespace hyperparallel
