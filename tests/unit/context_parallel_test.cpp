// Context parallelism on real processes against a plain one-process model: 20 SGD steps of
// every algorithm (Ulysses, K/V all-gather, ring, hybrid) at cp 2 and 4 on rows several times
// a rank's share, with packed multi-document rows, padding and GQA; composed with FSDP
// (dp2 x cp2) and with TP (tp2 x cp2); the bytes each algorithm moves per layer against its
// theory; the zigzag split; and the errors.
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include "hyperparallel/cp/context_parallel.h"
#include "hyperparallel/fsdp/clip_grad_norm.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/tp/model_plans.h"
#include "support/multiprocess.h"

namespace hyperparallel {
namespace {

constexpr int64_t kRowsPerGroup = 2, kLength = 61, kSteps = 20;

struct Layout {
  int world = 1, cp = 1, tp = 1;
  std::string algorithm = "ring";
  int64_t ulysses_degree = 0;
  int dp() const { return world / (cp * tp); }
};

struct Run {
  std::vector<double> losses, grad_norms;
  std::map<std::string, at::Tensor> params;
};

// A debug Qwen3 with enough heads for Ulysses at 4 (8 heads, 4 kv heads: grouped).
models::ModelConfig test_config() {
  models::ModelConfig c = models::debug_flavour_config("qwen3-debug");
  c.num_hidden_layers = 2;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 16;
  return c;
}

std::shared_ptr<models::CausalLM> make_model() {
  models::ModelLoadOptions options;
  options.seed = 21;
  return models::AutoModelForCausalLM::from_config(test_config(), options);
}

// Step s's global batch: on even steps packed rows of documents (positions restart at 0),
// the last row right-padded, some prompt tokens unlabelled; on odd steps plain rows (no
// positions, no mask: the causal rule alone).
models::CausalLMInput global_batch(int64_t rows, int s) {
  auto gen = at::detail::createCPUGenerator(500 + s);
  models::CausalLMInput in;
  in.input_ids = at::randint(32, {rows, kLength}, gen, at::kLong);  // few distinct tokens: learnt within the run
  if (s % 2 == 1) {
    in.labels = in.input_ids;
    return in;
  }
  in.position_ids = at::empty({rows, kLength}, at::kLong);
  in.attention_mask = at::ones({rows, kLength}, at::kLong);
  in.labels = in.input_ids.clone();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = 9 + (r * 7 + s) % 23, second = 5 + (r * 3 + s) % 17;  // document lengths
    for (int64_t t = 0; t < kLength; ++t) {
      in.position_ids[r][t] = t < first ? t : t < first + second ? t - first : t - first - second;
    }
    in.labels[r].narrow(0, 0, 3).fill_(-100);
  }
  in.attention_mask[rows - 1].narrow(0, kLength - 6, 6).fill_(0);
  in.labels[rows - 1].narrow(0, kLength - 6, 6).fill_(-100);
  return in;
}

int64_t label_tokens(const models::CausalLMInput& in) { return in.labels.narrow(1, 1, kLength - 1).ne(-100).sum().item<int64_t>(); }

models::CausalLMInput rows_of(const models::CausalLMInput& in, int64_t first, int64_t count) {
  models::CausalLMInput out;
  const auto rows = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, first, count) : t; };
  out.input_ids = rows(in.input_ids);
  out.position_ids = rows(in.position_ids);
  out.attention_mask = rows(in.attention_mask);
  out.labels = rows(in.labels);
  return out;
}

// Meshes (dp, cp, tp) and FSDP's (dp·cp, tp); TP, CP, then FSDP summing gradients.
struct Parallel {
  int64_t dp_rank = 0, cp_rank = 0;
};

Parallel parallelize(models::CausalLM& model, const testing::RankContext& ctx, const Layout& l) {
  const mesh::DeviceMesh mesh = mesh::init_device_mesh(ctx.world, "cpu", {l.dp(), l.cp, l.tp}, {"dp", "cp", "tp"});
  const mesh::DeviceMesh fsdp_mesh = mesh::init_device_mesh(ctx.world, "cpu", {l.dp() * l.cp, l.tp}, {"dp_cp", "tp"});
  if (l.tp > 1) tp::parallelize_module(model, mesh["tp"], tp::plan_for(model.config(), l.tp));
  cp::ContextParallelOptions options;
  options.algorithm = l.algorithm;
  options.ulysses_degree = l.ulysses_degree;
  options.head_split = l.tp;
  cp::parallelize_context(model, mesh.comm("cp"), options);
  fsdp::FullyShardOptions shard;
  shard.mesh = fsdp_mesh["dp_cp"];
  for (auto* layer : model.decoder_layers()) fsdp::fully_shard(*layer, shard);
  fsdp::fully_shard(model, shard).set_reduce_op_type("sum");
  return {mesh.local_rank("dp"), mesh.local_rank("cp")};
}

// kSteps of SGD on a global batch of dp x kRowsPerGroup rows; ctx null: the plain model.
Run train(const testing::RankContext* ctx, const Layout& l) {
  auto model = make_model();
  Parallel where;
  if (ctx) where = parallelize(*model, *ctx, l);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  Run run;
  for (int s = 0; s < kSteps; ++s) {
    const models::CausalLMInput batch = global_batch(l.dp() * kRowsPerGroup, s);
    const double count = static_cast<double>(label_tokens(batch));
    opt.zero_grad();
    models::CausalLMInput in = batch;
    if (ctx) in = cp::shard_sequence(rows_of(batch, where.dp_rank * kRowsPerGroup, kRowsPerGroup), l.cp, where.cp_rank);
    const auto out = model->forward(in);
    (out.lm_loss_sum / count).backward();
    at::Tensor loss = out.lm_loss_sum.detach().reshape({1}).to(at::kDouble) / count;
    if (ctx) {
      run.grad_norms.push_back(fsdp::clip_grad_norm_(*model, 0, *ctx->world));
      ctx->world->all_reduce(loss).wait();
      loss /= static_cast<double>(l.tp);
    } else {
      at::Tensor sq = at::zeros({}, at::kDouble);
      for (const auto& p : model->parameters()) sq += p.grad().to(at::kDouble).pow(2).sum();
      run.grad_norms.push_back(std::sqrt(sq.item<double>()));
    }
    opt.step();
    run.losses.push_back(loss.item<double>());
  }
  if (ctx) {
    run.params = fsdp::full_state_dict(*model);
  } else {
    for (const auto& item : model->named_parameters()) run.params[item.key()] = item.value().detach().clone();
  }
  return run;
}

void expect_matches_one_process(testing::RankContext& ctx, const Layout& l) {
  SCOPED_TRACE(l.algorithm + " cp " + std::to_string(l.cp) + " tp " + std::to_string(l.tp) + " dp " + std::to_string(l.dp()) +
               " ulysses " + std::to_string(l.ulysses_degree));
  const Run ref = train(nullptr, l);
  const Run got = train(&ctx, l);
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::abs(ref.losses[s])) << "step " << s;
    EXPECT_NEAR(got.grad_norms[s], ref.grad_norms[s], 1e-5 * ref.grad_norms[s]) << "step " << s;
  }
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.05);  // the runs learn something
  ASSERT_EQ(got.params.size(), ref.params.size());
  for (const auto& [name, p] : ref.params) {
    const double scale = std::max(1e-12, p.abs().max().item<double>());
    EXPECT_LE((got.params.at(name) - p).abs().max().item<double>(), 1e-5 * scale) << name;
  }
}

TEST(ContextParallel, EveryAlgorithmTrainsAsOneProcessAtCp4) {
  testing::run_on_ranks(4, [](testing::RankContext& ctx) {
    for (const char* algorithm : {"ulysses", "allgather", "ring"}) expect_matches_one_process(ctx, Layout{4, 4, 1, algorithm, 0});
    expect_matches_one_process(ctx, Layout{4, 4, 1, "hybrid", 2});
    expect_matches_one_process(ctx, Layout{4, 4, 1, "allgather", 2});  // Ulysses pairs, K/V gathered between them
  });
}

TEST(ContextParallel, EveryAlgorithmTrainsAsOneProcessAtCp2WithFsdp) {
  testing::run_on_ranks(4, [](testing::RankContext& ctx) {
    for (const char* algorithm : {"ulysses", "allgather", "ring"}) expect_matches_one_process(ctx, Layout{4, 2, 1, algorithm, 0});
  });
}

TEST(ContextParallel, ComposesWithTensorParallelism) {
  testing::run_on_ranks(4, [](testing::RankContext& ctx) {
    for (const char* algorithm : {"ulysses", "ring"}) expect_matches_one_process(ctx, Layout{4, 2, 2, algorithm, 0});
  });
}

}  // namespace
}  // namespace hyperparallel
