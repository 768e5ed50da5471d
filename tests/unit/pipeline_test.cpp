// Pipeline parallelism on real processes against a plain one-process model: 20 SGD steps of
// every schedule (GPipe, 1F1B, interleaved 1F1B with 2 virtual stages per rank, ZB-H1) at
// pp 2 and 4 on an 8-layer Llama, each global batch of packed and padded rows in
// micro-batches; pp2 x FSDP2 and pp2 x TP2 (1F1B, ZB-H1); the stage split; the errors.
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include "hyperparallel/fsdp/clip_grad_norm.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/pp/pipeline.h"
#include "hyperparallel/pp/stage_split.h"
#include "hyperparallel/tp/model_plans.h"
#include "support/multiprocess.h"
#include "support/parity_run.h"

namespace hyperparallel {
namespace {

constexpr int64_t kRows = 2, kLength = 24, kSteps = 20;

struct Layout {
  std::string schedule = "1f1b";
  int pp = 2, virtual_stages = 1, dp = 1, tp = 1;
  int64_t microbatches = 4;
  int world() const { return pp * dp * tp; }
};

models::ModelConfig test_config() {
  models::ModelConfig c = models::debug_flavour_config("llama-debug");
  c.num_hidden_layers = 8;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.head_dim = 16;
  return c;
}

std::shared_ptr<models::CausalLM> make_model() {
  models::ModelLoadOptions options;
  options.seed = 33;
  return models::AutoModelForCausalLM::from_config(test_config(), options);
}

// Micro-batch m of step s for data-parallel rank `dp_rank`: packed rows (positions restart at
// 0) on even steps, the last row right-padded; plain rows on odd steps.
models::CausalLMInput microbatch(int s, int64_t m, int64_t dp_rank) {
  auto gen = at::detail::createCPUGenerator(1000 + 97 * s + 13 * m + 7 * dp_rank);
  models::CausalLMInput in;
  in.input_ids = at::randint(40, {kRows, kLength}, gen, at::kLong);
  in.labels = in.input_ids.clone();
  if (s % 2 == 1) return in;
  in.position_ids = at::empty({kRows, kLength}, at::kLong);
  in.attention_mask = at::ones({kRows, kLength}, at::kLong);
  for (int64_t r = 0; r < kRows; ++r) {
    const int64_t first = 5 + (r * 5 + s + m) % 11;
    for (int64_t t = 0; t < kLength; ++t) in.position_ids[r][t] = t < first ? t : t - first;
    in.labels[r].narrow(0, 0, 2).fill_(-100);
  }
  in.attention_mask[kRows - 1].narrow(0, kLength - 4, 4).fill_(0);
  in.labels[kRows - 1].narrow(0, kLength - 4, 4).fill_(-100);
  return in;
}

int64_t label_tokens(const models::CausalLMInput& in) { return in.labels.narrow(1, 1, kLength - 1).ne(-100).sum().item<int64_t>(); }

// The global batch's label tokens: every data-parallel rank's micro-batches.
double global_label_tokens(int s, const Layout& l) {
  int64_t count = 0;
  for (int64_t d = 0; d < l.dp; ++d) {
    for (int64_t m = 0; m < l.microbatches; ++m) count += label_tokens(microbatch(s, m, d));
  }
  return static_cast<double>(count);
}

testing::ParityRun train_plain(const Layout& l) {
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  testing::ParityRun run;
  for (int s = 0; s < kSteps; ++s) {
    const double count = global_label_tokens(s, l);
    opt.zero_grad();
    double loss = 0;
    for (int64_t d = 0; d < l.dp; ++d) {
      for (int64_t m = 0; m < l.microbatches; ++m) {
        const auto out = model->forward(microbatch(s, m, d));
        (out.lm_loss_sum / count).backward();
        loss += out.lm_loss_sum.item<double>() / count;
      }
    }
    testing::record_step(run, nullptr, *model, at::scalar_tensor(loss, at::kDouble), 1);
    opt.step();
  }
  testing::record_parameters(run, nullptr, *model);
  return run;
}

// Mesh (pp, dp, tp); each rank keeps its stages, then TP and FSDP (summing gradients) inside them.
testing::ParityRun train_pipelined(const testing::RankContext& ctx, const Layout& l) {
  const mesh::DeviceMesh mesh = mesh::init_device_mesh(ctx.world, "cpu", {l.pp, l.dp, l.tp}, {"pp", "dp", "tp"});
  const int64_t pp_rank = mesh.local_rank("pp"), dp_rank = mesh.local_rank("dp");
  auto model = make_model();
  const auto split = pp::balanced_split(test_config().num_hidden_layers, l.pp * l.virtual_stages);
  pp::keep_stages(*model, split, pp_rank, l.pp);
  if (l.tp > 1) tp::parallelize_module(*model, mesh["tp"], tp::plan_for(model->config(), l.tp), {.pipeline_stage = true});
  std::optional<fsdp::FSDPModule> root;
  if (l.dp > 1) {
    fsdp::FullyShardOptions shard;
    shard.mesh = mesh["dp"];
    for (auto* layer : model->decoder_layers()) fsdp::fully_shard(*layer, shard);
    root = fsdp::fully_shard(*model, shard);
    root->set_reduce_op_type("sum");
  }
  pp::PipelineHooks hooks;
  if (root) {
    hooks.before_weight_backward = [&](int64_t, bool last) { root->set_requires_gradient_sync(last); };
    hooks.before_input_backward = [&](int64_t) { root->set_requires_gradient_sync(false); };
  }
  pp::PipelineStage stage(*model, split, pp::make_schedule(l.schedule, l.pp, l.microbatches, l.virtual_stages), mesh.comm("pp"),
                          hooks);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  testing::ParityRun run;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<models::CausalLMInput> mbs;
    for (int64_t m = 0; m < l.microbatches; ++m) mbs.push_back(microbatch(s, m, dp_rank));
    opt.zero_grad();
    const pp::PipelineStepResult result = stage.run(mbs, 1.0 / global_label_tokens(s, l));
    // The micro-batches held for backward at once are the schedule's, as simulated.
    EXPECT_EQ(result.peak_in_flight, pp::simulate(stage.schedule()).peak_in_flight[static_cast<size_t>(pp_rank)]);
    if (stage.schedule().splits_backward()) {
      // W starts every layer's and the head's weight gradients where I left them; only the
      // embedding (a segment without an input) replays, once per micro-batch on stage 0.
      EXPECT_GT(result.weight_groups_direct, 0);
      EXPECT_EQ(result.weight_groups_replayed, pp_rank == 0 ? l.microbatches : 0);
    }
    run.grad_norms.push_back(fsdp::clip_grad_norm_(*model, 0, *ctx.world, l.pp));
    at::Tensor loss = at::scalar_tensor(result.lm_loss_sum / global_label_tokens(s, l), at::kDouble).reshape({1});
    ctx.world->all_reduce(loss).wait();
    run.losses.push_back(loss.item<double>() / l.tp);
    opt.step();
  }
  run.params = fsdp::full_parameters(*model);  // FSDP rows and TP pieces gathered within the stage
  return run;
}

void expect_matches_one_process(testing::RankContext& ctx, const Layout& l) {
  SCOPED_TRACE(l.schedule + " pp " + std::to_string(l.pp) + " v " + std::to_string(l.virtual_stages) + " dp " + std::to_string(l.dp) +
               " tp " + std::to_string(l.tp));
  const testing::ParityRun ref = train_plain(l), got = train_pipelined(ctx, l);
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.05);  // the runs learn something
  // Each rank holds its stages' parameters; together the stages hold every one once.
  testing::ParityRun ref_here = ref;
  ref_here.params.clear();
  for (const auto& [name, p] : got.params) {
    ASSERT_TRUE(ref.params.count(name)) << name;
    ref_here.params[name] = ref.params.at(name);
  }
  at::Tensor held = at::full({1}, static_cast<double>(got.params.size()), at::kDouble);
  ctx.world->all_reduce(held).wait();
  EXPECT_EQ(held.item<double>(), static_cast<double>(ref.params.size() * l.dp * l.tp));
  testing::expect_same_training(ref_here, got, 1e-5);
}

TEST(PipelineParallel, EveryScheduleTrainsAsOneProcessAtPp2) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    for (const char* schedule : {"gpipe", "1f1b", "zero_bubble"}) expect_matches_one_process(ctx, {schedule, 2, 1});
    expect_matches_one_process(ctx, {"interleaved_1f1b", 2, 2});
  });
}

// 4 ranks on 2 cores, several schedules each: 85-110 s on an idle AVX2 machine, so the hang
// guard is well above the default 120 s.
testing::MultiProcessOptions wide_options() {
  testing::MultiProcessOptions options;
  options.time_limit = std::chrono::seconds(360);
  return options;
}

TEST(PipelineParallelWide, EveryScheduleTrainsAsOneProcessAtPp4) {
  testing::run_on_ranks(4, [](testing::RankContext& ctx) {
    for (const char* schedule : {"gpipe", "1f1b", "zero_bubble"}) expect_matches_one_process(ctx, {schedule, 4, 1, 1, 1, 8});
    expect_matches_one_process(ctx, {"interleaved_1f1b", 4, 2, 1, 1, 8});
  }, wide_options());
}

TEST(PipelineParallelWide, StagesComposeWithFsdpAndTensorParallel) {
  testing::run_on_ranks(4, [](testing::RankContext& ctx) {
    expect_matches_one_process(ctx, {"1f1b", 2, 1, 2, 1});
    expect_matches_one_process(ctx, {"zero_bubble", 2, 1, 2, 1});
    expect_matches_one_process(ctx, {"interleaved_1f1b", 2, 2, 2, 1});
    expect_matches_one_process(ctx, {"1f1b", 2, 1, 1, 2});
    expect_matches_one_process(ctx, {"zero_bubble", 2, 1, 1, 2});
  }, wide_options());
}

TEST(PipelineParallel, BalancedSplitCountsTheEmbeddingAndTheHead) {
  EXPECT_EQ(pp::to_string(pp::balanced_split(8, 2)), "0-3, 4-7");
  EXPECT_EQ(pp::to_string(pp::balanced_split(8, 4)), "0-0, 1-3, 4-6, 7-7");
  EXPECT_EQ(pp::to_string(pp::balanced_split(8, 8)), "none, 0-1, 2-3, 4-4, 5-5, 6-6, 7-7, none");
  EXPECT_EQ(pp::to_string(pp::balanced_split(5, 1)), "0-4");
  const auto split = pp::balanced_split(8, 4);
  EXPECT_TRUE(split.front().embedding && !split.front().head && split.back().head && !split[1].embedding && !split[1].head);
  EXPECT_EQ(pp::to_string(pp::explicit_split({"0-2", " 3 - 6", "7"}, 8, 3)), "0-2, 3-6, 7-7");
  EXPECT_EQ(pp::stages_of_rank(1, 4, 2), (std::vector<int64_t>{1, 5}));
}

TEST(PipelineParallel, ABadSplitIsAUserErrorNamingIt) {
  const auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { pp::balanced_split(4, 7); }).find("use at most 6 stages"), std::string::npos);
  EXPECT_NE(message([] { pp::explicit_split({"0-3"}, 8, 2); }).find("lists 1 ranges for 2 stages"), std::string::npos);
  EXPECT_NE(message([] { pp::explicit_split({"0-3", "5-7"}, 8, 2); }).find("'5-7' should start at layer 4"), std::string::npos);
  EXPECT_NE(message([] { pp::explicit_split({"0-3", "4-8"}, 8, 2); }).find("end before layer 8"), std::string::npos);
  EXPECT_NE(message([] { pp::explicit_split({"0-3", "4-6"}, 8, 2); }).find("ends at layer 6; the model has 8"), std::string::npos);
  EXPECT_NE(message([] { pp::explicit_split({"0-3", "x"}, 8, 2); }).find("'x' is not a layer range"), std::string::npos);
  auto model = make_model();
  pp::keep_stages(*model, pp::balanced_split(8, 2), 1, 2);
  EXPECT_NE(message([&] { model->forward(microbatch(1, 0, 0)); }).find("holds only part of itself"), std::string::npos);
  models::ModelSpan first = pp::balanced_split(8, 2).front();
  EXPECT_NE(message([&] { model->forward_span(microbatch(1, 0, 0), {}, first); }).find("does not hold the embedding"), std::string::npos);
}

}  // namespace
}  // namespace hyperparallel
