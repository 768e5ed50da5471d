// Validation mode: the shipped plans pass it and give bit-identical numbers to Production
// mode; planted plan errors (colwise on the wrong projection, a rowwise input that is not
// sharded, a sequence-parallel norm on a replicated input, a missing all-reduce, a sharded
// input reaching a whole Linear) each fail on every rank with a message naming the module,
// the op, the expected and the actual placement.
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/tp/loss_parallel.h"
#include "hyperparallel/tp/model_plans.h"
#include "support/multiprocess.h"

namespace hyperparallel {
namespace {

constexpr int64_t kBatch = 2, kSeq = 9;  // odd: uneven sequence shards under SP

struct Run {
  std::vector<at::Tensor> losses;
  std::map<std::string, at::Tensor> params;
  int64_t tp_all_gathers = 0;  // over the run: Validation mode's measurements are all-gathers
};

at::Tensor batch(int64_t vocab, int step) {
  auto gen = at::detail::createCPUGenerator(300 + step);
  return at::randint(vocab, {kBatch, kSeq}, gen, at::kLong);
}

// Three SGD steps of `flavour` under `plan` on the tp ranks of `mesh` (a tp axis, and a
// dp_shard axis for FSDP when it has one).
Run train(const std::string& flavour, const mesh::DeviceMesh& mesh, const tp::TensorParallelOptions& plan_options,
          bool validate) {
  models::ModelLoadOptions load;
  load.seed = 5;
  auto model = models::AutoModelForCausalLM::from_pretrained(flavour, load);
  const int64_t tp = mesh["tp"].size();
  tp::parallelize_module(*model, mesh["tp"], tp::plan_for(model->config(), tp, plan_options), {validate});
  if (plan_options.loss_parallel) tp::enable_loss_parallel(*model, mesh["tp"]);
  int64_t dp = 1, dp_rank = 0;
  if (mesh.ndim() == 2) {
    fsdp::FullyShardOptions shard;
    shard.mesh = mesh["dp_shard"];
    for (auto* layer : model->decoder_layers()) fsdp::fully_shard(*layer, shard);
    fsdp::fully_shard(*model, shard);
    dp = mesh["dp_shard"].size();
    dp_rank = mesh.coordinates()[0];
  }
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
  Run run;
  mesh.comm("tp")->reset_counters();
  for (int s = 0; s < 3; ++s) {
    models::CausalLMInput in;
    in.input_ids = batch(model->config().vocab_size, s).repeat({dp, 1}).narrow(0, dp_rank * kBatch, kBatch);
    in.labels = in.input_ids;
    auto out = model->forward(in);
    opt.zero_grad();
    out.loss.backward();
    opt.step();
    run.losses.push_back(out.loss.detach().clone());
  }
  run.tp_all_gathers = mesh.comm("tp")->counters()[comm::CollectiveKind::kAllGather].calls;
  run.params = fsdp::full_state_dict(*model);
  return run;
}

void expect_identical(const Run& production, const Run& validation) {
  for (size_t s = 0; s < production.losses.size(); ++s) {
    EXPECT_TRUE(at::equal(production.losses[s], validation.losses[s]))
        << "step " << s << ": " << production.losses[s].item<double>() << " vs " << validation.losses[s].item<double>();
  }
  for (const auto& [name, p] : production.params) EXPECT_TRUE(at::equal(p, validation.params.at(name))) << name;
  EXPECT_GT(validation.tp_all_gathers, production.tp_all_gathers + 30) << "the checks ran";
}

tp::TensorParallelOptions options(bool sp, bool lp) {
  tp::TensorParallelOptions o;
  o.sequence_parallel = sp;
  o.loss_parallel = lp;
  return o;
}

TEST(PlacementValidation, ShippedPlansPassAndGiveBitIdenticalNumbers) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    const auto mesh = mesh::init_device_mesh(ctx.world, "cpu", {2}, {"tp"});
    for (const std::string flavour : {"llama-debug", "qwen2-debug", "qwen3-debug", "qwen3-moe-debug"}) {
      for (const auto& o : {options(false, false), options(true, false), options(true, true)}) {
        SCOPED_TRACE(flavour + (o.sequence_parallel ? " +sp" : "") + (o.loss_parallel ? " +loss parallel" : ""));
        expect_identical(train(flavour, mesh, o, false), train(flavour, mesh, o, true));
      }
    }
  });
}

TEST(PlacementValidation, PlansUnderFsdpAndWithReplicatedKvHeadsPass) {
  testing::MultiProcessOptions slow;
  slow.time_limit = std::chrono::seconds(300);
  testing::run_on_ranks(4, [](testing::RankContext& ctx) {
    const auto fsdp_tp = mesh::init_device_mesh(ctx.world, "cpu", {2, 2}, {"dp_shard", "tp"});
    expect_identical(train("qwen3-debug", fsdp_tp, options(true, true), false), train("qwen3-debug", fsdp_tp, options(true, true), true));
    const auto tp4 = mesh::init_device_mesh(ctx.world, "cpu", {4}, {"tp"});  // 2 kv heads < 4 ranks
    expect_identical(train("llama-debug", tp4, options(true, false), false), train("llama-debug", tp4, options(true, false), true));
  }, slow);
}

// The message a plan's first forward raises in Validation mode ("" if none).
std::string validation_error(const mesh::DeviceMesh& tp_mesh, const tp::ParallelizePlan& plan,
                             const std::string& flavour = "qwen3-debug") {
  models::ModelLoadOptions load;
  load.seed = 5;
  auto model = models::AutoModelForCausalLM::from_pretrained(flavour, load);
  tp::parallelize_module(*model, tp_mesh, plan, {/*validate_placement=*/true});
  models::CausalLMInput in;
  in.input_ids = batch(model->config().vocab_size, 0);
  in.labels = in.input_ids;
  try {
    model->forward(in);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

void expect_mentions(const std::string& message, const std::vector<std::string>& parts) {
  ASSERT_FALSE(message.empty()) << "the plan error was not caught";
  for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << "missing '" << part << "' in: " << message;
}

TEST(PlacementValidation, PlantedPlanErrorsNameTheModuleTheOpAndBothPlacements) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    const auto mesh = mesh::init_device_mesh(ctx.world, "cpu", {2}, {"tp"});
    const std::string attn = "model.layers.*.self_attn.", mlp = "model.layers.*.mlp.";

    // 1. Colwise on the wrong projection: o_proj consumes local heads, i.e. Shard(-1) features.
    tp::ParallelizePlan colwise_o;
    for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"}) colwise_o.add(attn + p, tp::ColwiseParallel{});
    expect_mentions(validation_error(mesh, colwise_o),
                    {"'model.layers.0.self_attn.o_proj' (ColwiseParallel), op linear: input expected Replicate()",
                     "actual Shard(2)"});

    // 2. A rowwise input that is not sharded: down_proj's features arrive whole.
    tp::ParallelizePlan rowwise_only;
    rowwise_only.add(mlp + "down_proj", tp::RowwiseParallel{});
    expect_mentions(validation_error(mesh, rowwise_only),
                    {"'model.layers.0.mlp.down_proj' (RowwiseParallel), op linear: input expected Shard(-1)",
                     "actual Replicate() (the same [2, 9, "});

    // 3. A sequence-parallel norm whose input was never sharded over the sequence.
    tp::ParallelizePlan sp_norm;
    sp_norm.add("model.layers.*.input_layernorm", tp::SequenceParallel{});
    expect_mentions(validation_error(mesh, sp_norm),
                    {"'model.layers.0.input_layernorm' (SequenceParallel), op norm: input expected Shard(1)",
                     "actual Replicate()"});

    // 4. A missing all-reduce: o_proj's partial sums go back into the residual stream.
    tp::ParallelizePlan unreduced;
    for (const char* p : {"q_proj", "k_proj", "v_proj"}) unreduced.add(attn + p, tp::ColwiseParallel{});
    tp::RowwiseParallel partial_out;
    partial_out.output_layout = dtensor::Partial();
    unreduced.add(attn + "o_proj", partial_out);
    expect_mentions(validation_error(mesh, unreduced),
                    {"'model.layers.0.self_attn' (not in the plan), op residual add: output expected Replicate()",
                     "actual Partial(sum) or diverged"});

    // 6. Sequence parallelism without the block's gather: attention's softmax needs every key.
    tp::ParallelizePlan no_gather;
    tp::RowwiseParallel sequence_out;
    sequence_out.output_layout = dtensor::Shard(1);
    no_gather.add("model.embed_tokens", sequence_out);
    no_gather.add("model.layers.*.input_layernorm", tp::SequenceParallel{});
    expect_mentions(validation_error(mesh, no_gather),
                    {"'model.layers.0.self_attn' (not in the plan), op attention: input expected Replicate() with 128 features "
                     "(softmax runs over every key), actual Shard(1)"});

    // 7. Loss parallel's head without its loss: plain cross-entropy sees a vocab shard.
    const auto config = models::debug_flavour_config("qwen3-debug");
    tp::TensorParallelOptions lp;
    lp.loss_parallel = true;
    expect_mentions(validation_error(mesh, tp::plan_for(config, 2, lp)),
                    {"'lm_head -> loss' (not in the plan), op cross-entropy: logits expected Replicate() with dim 2 of 512",
                     "actual Shard(2) (lengths 256, 256 on dim 2 of 512"});

    // 5. A sharded input reaching a Linear the plan left whole.
    tp::ParallelizePlan no_down;
    no_down.add(mlp + "gate_proj", tp::ColwiseParallel{});
    no_down.add(mlp + "up_proj", tp::ColwiseParallel{});
    expect_mentions(validation_error(mesh, no_down),
                    {"'model.layers.0.mlp.down_proj' (not in the plan), op linear: input expected Replicate() or Shard(d) on a dim "
                     "other than the",
                     "actual Shard(2)"});
  });
}

// 8. Heads split mid-head: llama-debug's q_proj is 4 heads of 32; over 3 ranks the ceil split
// gives 43, 43 and 42 features, which attention cannot view as heads.
TEST(PlacementValidation, AColwiseSplitThatCutsHeadsIsNamed) {
  testing::run_on_ranks(3, [](testing::RankContext& ctx) {
    const auto mesh = mesh::init_device_mesh(ctx.world, "cpu", {3}, {"tp"});
    tp::ParallelizePlan cut;
    cut.add("model.layers.*.self_attn.q_proj", tp::ColwiseParallel{});
    expect_mentions(validation_error(mesh, cut, "llama-debug"),
                    {"'model.layers.0.self_attn.q_proj' (ColwiseParallel), op view as [.., heads, head_dim]: output expected "
                     "whole heads of 32 on every rank, actual widths 43, 43, 42"});
  });
}

}  // namespace
}  // namespace hyperparallel
