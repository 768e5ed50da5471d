// Expert parallelism on real processes against a plain one-process Qwen3-MoE: training under
// SGD (losses, gradient norms and every parameter) on EP2 and EP4, with FSDP over the
// expert-data-parallel ranks and over the dense ranks, with routing that differs per rank
// and with every token forced onto the same two experts (the others get none anywhere);
// ranks sharing tokens (a tensor-parallel group) dispatching each token once; the
// all-to-all bytes against the routed rows; whole-model views (full state dict, HF loading)
// and the errors.
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include "hyperparallel/dtensor/parameter_specs.h"
#include "hyperparallel/ep/expert_parallel.h"
#include "hyperparallel/fsdp/clip_grad_norm.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/io/hf_checkpoint.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/models/plan_overrides.h"
#include "hyperparallel/platform/user_error.h"
#include "support/multiprocess.h"
#include "support/parity_run.h"

namespace hyperparallel {
namespace {

constexpr int64_t kRowsPerGroup = 2, kSeq = 8, kSteps = 5;

// How a run is laid out: `ep` experts ranks; `token_groups` consecutive ranks share each
// micro-batch (as a tp group does; dense layers replicated over them).
struct Layout {
  int world = 1, ep = 1, token_groups = 1;
  bool forced_routing = false;
  double capacity = 0;  // ep::set_expert_capacity; 0 dropless
};

std::shared_ptr<models::CausalLM> make_model(const Layout& layout) {
  models::ModelLoadOptions options;
  options.seed = 13;
  auto model = models::AutoModelForCausalLM::from_pretrained("qwen3-moe-debug", options);
  ep::set_expert_capacity(*model, layout.capacity);
  if (layout.forced_routing) {
    // A zero router scores every expert alike: top-k picks the same two for every token.
    at::NoGradGuard no_grad;
    for (const auto& item : model->named_parameters()) {
      if (item.key().find(".mlp.gate.") != std::string::npos) item.value().zero_();
    }
  }
  return model;
}

// EP over (edp, ep), then FSDP: experts over edp, dense layers over the data ranks.
void parallelize(models::CausalLM& model, const testing::RankContext& ctx, const Layout& layout) {
  const int64_t edp = ctx.world_size / layout.ep;
  const mesh::DeviceMesh experts = mesh::init_device_mesh(ctx.world, "cpu", {edp, layout.ep}, {"edp", "ep"});
  const mesh::DeviceMesh dense = mesh::init_device_mesh(ctx.world, "cpu", {ctx.world_size / layout.token_groups, layout.token_groups},
                                                        {"dp_shard", "tp"});
  ep::ExpertParallelOptions options;
  if (layout.token_groups > 1) options.token_split = dense.comm("tp");
  ep::parallelize_experts(model, experts["ep"], options);
  fsdp::FullyShardOptions expert_shard;
  expert_shard.mesh = experts["edp"];
  for (auto* m : ep::expert_modules(model)) fsdp::fully_shard(*m, expert_shard);
  fsdp::FullyShardOptions dense_shard;
  dense_shard.mesh = dense["dp_shard"];
  for (auto* layer : model.decoder_layers()) fsdp::fully_shard(*layer, dense_shard);
  fsdp::fully_shard(model, dense_shard).set_reduce_op_type("sum");
}

// kSteps of SGD on a global batch of (world / token_groups) micro-batches; rank 0's rows
// repeat one token, so its routing differs from the others'. ctx null: the plain model on
// the whole batch.
testing::ParityRun train(const testing::RankContext* ctx, const Layout& layout) {
  auto model = make_model(layout);
  if (ctx) parallelize(*model, *ctx, layout);
  std::vector<at::Tensor> trained;
  for (const auto& item : model->named_parameters()) {
    if (!layout.forced_routing || item.key().find(".mlp.gate.") == std::string::npos) trained.push_back(item.value());
  }
  torch::optim::SGD opt(trained, torch::optim::SGDOptions(0.02).momentum(0.9));
  const int64_t groups = layout.world / layout.token_groups;
  const int64_t group = ctx ? ctx->rank / layout.token_groups : 0;
  const double label_tokens = static_cast<double>(groups * kRowsPerGroup * (kSeq - 1));
  testing::ParityRun run;
  for (int s = 0; s < kSteps; ++s) {
    auto gen = at::detail::createCPUGenerator(300 + s);
    at::Tensor ids = at::randint(model->config().vocab_size, {groups * kRowsPerGroup, kSeq}, gen, at::kLong);
    ids.narrow(0, 0, kRowsPerGroup).fill_(7);
    // The plain model runs the whole batch in one forward, or with a capacity (decided per
    // forward) one forward per micro-batch, its gradients accumulated.
    const bool per_group = !ctx && layout.capacity > 0;
    opt.zero_grad();
    at::Tensor loss = at::zeros({1}, at::kDouble);
    for (int64_t g = 0; g < (per_group ? groups : 1); ++g) {
      models::CausalLMInput in;
      in.input_ids = ctx ? ids.narrow(0, group * kRowsPerGroup, kRowsPerGroup) : per_group ? ids.narrow(0, g * kRowsPerGroup, kRowsPerGroup) : ids;
      in.labels = in.input_ids;
      in.output_router_logits = false;
      auto out = model->forward(in);
      (out.lm_loss_sum / label_tokens).backward();
      loss += out.lm_loss_sum.detach().reshape({1}).to(at::kDouble) / label_tokens;
    }
    testing::record_step(run, ctx, *model, loss, static_cast<double>(layout.token_groups));
    opt.step();
  }
  testing::record_parameters(run, ctx, *model);
  return run;
}

void expect_matches_one_process(testing::RankContext& ctx, const Layout& layout) {
  SCOPED_TRACE("world " + std::to_string(layout.world) + " ep " + std::to_string(layout.ep) + " token groups " +
               std::to_string(layout.token_groups) + (layout.forced_routing ? " forced routing" : "") + " capacity " +
               std::to_string(layout.capacity));
  const testing::ParityRun ref = train(nullptr, layout), got = train(&ctx, layout);
  testing::expect_same_training(ref, got, 1e-5);
}

TEST(ExpertParallel, TrainingMatchesOneProcessOnEp2AndEp4WithFsdp) {
  testing::run_on_ranks(4, [](testing::RankContext& ctx) {
    for (int ep : {2, 4}) {
      for (bool forced : {false, true}) expect_matches_one_process(ctx, Layout{4, ep, 1, forced});
    }
  });
}

TEST(ExpertParallel, RanksSharingTokensDispatchEachTokenOnce) {
  testing::run_on_ranks(4, [](testing::RankContext& ctx) {
    expect_matches_one_process(ctx, Layout{4, 2, 2, false});  // ep group = the token group
    expect_matches_one_process(ctx, Layout{4, 4, 2, false});  // ep group spans two token groups
  });
}

// Every (token, slot) pair routed to the other rank's experts crosses once each way in
// forward and again in backward; the per-expert counts travel first.
TEST(ExpertParallel, AllToAllBytesAreTheRoutedRows) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    auto model = make_model(Layout{});
    const models::ModelConfig& c = model->config();
    const mesh::DeviceMesh mesh = mesh::init_device_mesh(ctx.world, "cpu", {2}, {"ep"});
    ep::parallelize_experts(*model, mesh);
    auto gen = at::detail::createCPUGenerator(5 + ctx.rank);
    models::CausalLMInput in;
    in.input_ids = at::randint(c.vocab_size, {3, 5}, gen, at::kLong);
    in.labels = in.input_ids;
    in.output_router_logits = true;
    mesh.comm()->reset_counters();
    auto out = model->forward(in);
    out.loss.backward();
    const comm::CollectiveCount moved = mesh.comm()->counters()[comm::CollectiveKind::kAllToAll];
    // Pairs this rank routes to the other rank's experts, per layer, then the peer's.
    const int64_t local = c.num_experts / 2;
    at::Tensor to_other = at::zeros({static_cast<int64_t>(out.router_logits.size())}, at::kLong);
    for (size_t l = 0; l < out.router_logits.size(); ++l) {
      const at::Tensor selected = std::get<1>(at::topk(at::softmax(out.router_logits[l], -1), c.num_experts_per_tok, -1));
      const at::Tensor other = ctx.rank == 0 ? selected >= local : selected < local;
      to_other[static_cast<int64_t>(l)] = other.sum();
    }
    at::Tensor both = at::empty({2, to_other.size(0)}, at::kLong);
    ctx.world->all_gather(both, to_other).wait();
    const int64_t rows = both.sum().item<int64_t>();  // sent plus received, over the layers
    const int64_t layers = to_other.size(0);
    EXPECT_EQ(moved.calls, layers * 5);  // counts, dispatch, combine; backward's combine, dispatch
    EXPECT_EQ(moved.bytes, rows * c.hidden_size * 4 * 2 + layers * local * 8);
    EXPECT_GT(rows, 0);
  });
}

// The whole model is visible on every rank: HF folders load into an expert-parallel model
// (each rank holding only its experts), its full state dict is the file's, and the whole
// model's names come in the unsplit model's order.
TEST(ExpertParallel, WholeModelViewsSeeEveryExpert) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    const std::string dir = HP_SOURCE_DIR "/tests/fixtures/hf/qwen3_moe";
    models::ModelLoadOptions deferred;
    deferred.deferred_init = true;
    auto model = models::AutoModelForCausalLM::from_pretrained(dir, deferred);
    ep::parallelize_experts(*model, mesh::init_device_mesh(ctx.world, "cpu", {2}, {"ep"}));
    for (const auto& item : model->named_parameters()) {
      const auto at = item.key().find(".experts.");
      if (at == std::string::npos) continue;
      const int64_t expert = std::stoll(item.key().substr(at + 9));
      EXPECT_EQ(expert / 4, ctx.rank) << item.key() << " is on the wrong rank";
    }
    models::load_pretrained_weights(*model, dir);
    io::HfCheckpoint checkpoint(dir);
    const auto full = fsdp::full_state_dict(*model);
    EXPECT_EQ(full.size(), checkpoint.names().size());
    for (const auto& name : checkpoint.names()) EXPECT_TRUE(at::equal(full.at(name), checkpoint.read(name))) << name;
    EXPECT_EQ(fsdp::full_parameter_shapes(*model).size(), checkpoint.names().size());
    // Export writes tensors in the unsplit model's order.
    auto plain = models::AutoModelForCausalLM::from_pretrained(dir, deferred);
    std::vector<std::string> plain_names;
    for (const auto& item : plain->named_parameters()) plain_names.push_back(item.key());
    EXPECT_EQ(dtensor::full_parameter_names(*model), plain_names);
  });
}

// The grouped_experts plan override (sort once, contiguous rows per expert, one scatter-add)
// against the reference loop: logits and every gradient within 1e-6, with learned routing and
// with every token on the same two experts.
TEST(ExpertParallel, GroupedExpertsEqualTheLoop) {
  for (bool forced : {false, true}) {
    SCOPED_TRACE(forced ? "forced routing" : "learned routing");
    auto loop = make_model(Layout{1, 1, 1, forced});
    auto grouped = make_model(Layout{1, 1, 1, forced});
    const auto replaced = models::apply_plan_overrides(*grouped, grouped->config(),
                                                       {{"*.mlp", "Qwen3MoeSparseMoeBlock", "grouped_experts"}},
                                                       models::ReplacementRegistry::with_builtins());
    EXPECT_EQ(replaced.size(), static_cast<size_t>(grouped->config().num_hidden_layers));
    auto gen = at::detail::createCPUGenerator(77);
    models::CausalLMInput in;
    in.input_ids = at::randint(loop->config().vocab_size, {3, 11}, gen, at::kLong);
    in.labels = in.input_ids;
    auto a = loop->forward(in), b = grouped->forward(in);
    EXPECT_LE((a.logits - b.logits).abs().max().item<double>(), 1e-6);
    a.loss.backward();
    b.loss.backward();
    auto grads = grouped->named_parameters();
    for (const auto& item : loop->named_parameters()) {
      ASSERT_TRUE(grads[item.key()].grad().defined()) << item.key();
      EXPECT_LE((item.value().grad() - grads[item.key()].grad()).abs().max().item<double>(), 1e-6) << item.key();
    }
  }
  auto dense = models::AutoModelForCausalLM::from_pretrained("qwen3-debug", {});
  EXPECT_THROW(models::apply_plan_overrides(*dense, dense->config(), {{"*.mlp", "Qwen3MLP", "grouped_experts"}},
                                            models::ReplacementRegistry::with_builtins()),
               UserError);
}

// A capacity factor drops the same pairs on every path: the count is what the priority rule
// gives (every token forced onto the same two experts: each keeps its first ceil(N·k/E)
// pairs), grouped experts equal the loop, and EP2 / EP4 with token groups train as the plain
// model run per micro-batch.
TEST(ExpertParallel, CapacityDropsTheSamePairsOnEveryPath) {
  {
    auto model = make_model(Layout{1, 1, 1, true, 1.0});
    models::CausalLMInput in;
    auto gen = at::detail::createCPUGenerator(9);
    in.input_ids = at::randint(model->config().vocab_size, {2, 10}, gen, at::kLong);
    model->forward(in);
    const int64_t pairs = 20 * 2, capacity = (pairs + 7) / 8, layers = model->config().num_hidden_layers;
    const ep::ExpertLoad load = ep::take_expert_load(*model);
    EXPECT_EQ(load.routed, pairs * layers);
    EXPECT_EQ(load.dropped, (pairs - 2 * capacity) * layers);  // two experts keep `capacity` each
    EXPECT_EQ(ep::take_expert_load(*model).routed, 0);
  }
  for (double capacity : {0.5, 1.25}) {
    auto loop = make_model(Layout{1, 1, 1, false, capacity});
    auto grouped = make_model(Layout{1, 1, 1, false, capacity});
    models::apply_plan_overrides(*grouped, grouped->config(), {{"*.mlp", "Qwen3MoeSparseMoeBlock", "grouped_experts"}},
                                 models::ReplacementRegistry::with_builtins());
    auto gen = at::detail::createCPUGenerator(78);
    models::CausalLMInput in;
    in.input_ids = at::randint(loop->config().vocab_size, {3, 11}, gen, at::kLong);
    EXPECT_LE((loop->forward(in).logits - grouped->forward(in).logits).abs().max().item<double>(), 1e-6) << capacity;
    EXPECT_GT(ep::take_expert_load(*loop).dropped, 0) << capacity;
  }
  testing::run_on_ranks(4, [](testing::RankContext& ctx) {
    expect_matches_one_process(ctx, Layout{4, 2, 1, false, 1.0});
    expect_matches_one_process(ctx, Layout{4, 4, 2, false, 0.75});
  });
  EXPECT_THROW(ep::set_expert_capacity(*make_model(Layout{}), -1), UserError);
}

TEST(ExpertParallel, SizesThatDoNotFitAreUserErrors) {
  testing::run_on_ranks(3, [](testing::RankContext& ctx) {
    auto moe = make_model(Layout{});
    const mesh::DeviceMesh mesh = mesh::init_device_mesh(ctx.world, "cpu", {3}, {"ep"});
    try {
      ep::parallelize_experts(*moe, mesh);
      ADD_FAILURE() << "ep 3 over 8 experts was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("ep size 3 does not divide the 8 experts of model.layers.0.mlp; valid ep sizes: 1, 2, 4, 8"),
                std::string::npos)
          << e.what();
    }
    auto dense = models::AutoModelForCausalLM::from_pretrained("qwen3-debug", {});
    EXPECT_THROW(ep::parallelize_experts(*dense, mesh), UserError);
  });
}

}  // namespace
}  // namespace hyperparallel
