// Memory features against the plain model. Activation checkpointing: one process (losses,
// logits, every gradient, the MoE aux loss through the recomputed router, the recompute
// counted; the op policy's projections not rerun), every k-th layer, and on real processes
// under FSDP and expert parallelism (a nested FSDP unit recomputed during backward), where SGD
// training must match the plain model. Chunked loss: the loss and every gradient at several chunk sizes, with padding,
// tied heads and checkpointing. Activation swap: the same numbers, every kept input out to the
// pool and back, each but the last layer's brought back ahead.
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include "hyperparallel/ep/expert_parallel.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/activation_checkpoint.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/nn/forward_hooks.h"
#include "models/attention.h"
#include "models/decoder.h"
#include "hyperparallel/platform/user_error.h"
#include "support/multiprocess.h"

namespace hyperparallel {
namespace {

// Counts the forwards of the module it is attached to.
struct CountingHook : nn::ForwardHook {
  int calls = 0;
  at::Tensor around(const at::Tensor& input, const nn::Forward& next) override {
    ++calls;
    return next(input);
  }
};

std::shared_ptr<models::CausalLM> make(const std::string& flavour) {
  models::ModelLoadOptions options;
  options.seed = 21;
  return models::AutoModelForCausalLM::from_pretrained(flavour, options);
}

models::CausalLMInput batch(const models::ModelConfig& c, uint64_t seed, int64_t rows = 3, int64_t seq = 12) {
  auto gen = at::detail::createCPUGenerator(seed);
  models::CausalLMInput in;
  in.input_ids = at::randint(c.vocab_size, {rows, seq}, gen, at::kLong);
  in.labels = in.input_ids.clone();
  in.labels.narrow(1, 0, 2).fill_(-100);
  in.attention_mask = at::ones({rows, seq}, at::kLong);
  in.attention_mask[0].narrow(0, seq - 3, 3).fill_(0);  // padding in row 0
  return in;
}

// Records where each output of the module it is attached to lives.
struct OutputAddressHook : nn::ForwardHook {
  std::vector<const void*> outputs;
  at::Tensor around(const at::Tensor& input, const nn::Forward& next) override {
    at::Tensor out = next(input);
    outputs.push_back(out.data_ptr());
    return out;
  }
};

TEST(Memory, ActivationCheckpointingEqualsThePlainModelInOneProcess) {
  const std::vector<std::pair<std::string, std::string>> policies{{"full", "op"}, {"selective", "op"}, {"selective", "attention_core"}};
  for (const std::string flavour : {"qwen3-debug", "llama-debug", "qwen3-moe-debug"}) {
    for (const auto& [mode, policy] : policies) {
      for (int64_t every : {1, 2}) {
        SCOPED_TRACE(flavour + " " + mode + " (" + policy + ") every " + std::to_string(every));
        const bool core_only = mode == "selective" && policy == "attention_core";
        auto plain = make(flavour), checkpointed = make(flavour);
        const auto layers = models::apply_activation_checkpointing(*checkpointed, {mode, every, false, policy});
        EXPECT_EQ(static_cast<int64_t>(layers.size()), (plain->config().num_hidden_layers + every - 1) / every);
        const models::CausalLMInput in = batch(plain->config(), 5);
        // A checkpointed layer's attention runs twice per step (forward, recompute), the
        // others once; attention_core: once, its core recomputed inside.
        std::vector<std::shared_ptr<CountingHook>> counters;
        // op: the recompute gets each projection's output back from the forward (the same
        // memory: no GEMM ran again), including the experts' and the router's.
        std::vector<std::shared_ptr<OutputAddressHook>> projections;
        auto& decoder = checkpointed->backbone().decoder_layers;
        for (size_t i = 0; i < decoder.size(); ++i) {
          counters.push_back(std::make_shared<CountingHook>());
          nn::add_forward_hook(*decoder[i]->self_attn, counters.back());
          const bool on = static_cast<int64_t>(i) % every == 0;
          EXPECT_EQ(dynamic_cast<models::Attention&>(*decoder[i]->self_attn).recompute_core, on && core_only);
          EXPECT_EQ(decoder[i]->keep_linear_outputs, on && mode == "selective" && !core_only);
          if (!on || mode != "selective" || core_only) continue;
          for (const auto& item : decoder[i]->named_modules()) {
            if (item.value()->name() != "Linear") continue;
            projections.push_back(std::make_shared<OutputAddressHook>());
            nn::add_forward_hook(*item.value(), projections.back());
          }
        }
        auto a = plain->forward(in), b = checkpointed->forward(in);
        EXPECT_TRUE(at::equal(a.logits, b.logits));
        EXPECT_EQ(a.loss.item<double>(), b.loss.item<double>());
        if (a.aux_loss.defined()) {
          EXPECT_EQ(a.aux_loss.item<double>(), b.aux_loss.item<double>());
        }
        a.loss.backward();
        b.loss.backward();
        for (size_t i = 0; i < counters.size(); ++i) {
          EXPECT_EQ(counters[i]->calls, !core_only && i % every == 0 ? 2 : 1) << "layer " << i;
        }
        for (const auto& p : projections) {
          ASSERT_EQ(p->outputs.size() % 2, 0u);  // run in the forward and in the recompute
          const size_t n = p->outputs.size() / 2;
          for (size_t k = 0; k < n; ++k) EXPECT_EQ(p->outputs[k], p->outputs[n + k]);
        }
        auto grads = checkpointed->named_parameters();
        for (const auto& item : plain->named_parameters()) {
          ASSERT_TRUE(grads[item.key()].grad().defined()) << item.key();
          EXPECT_LE((item.value().grad() - grads[item.key()].grad()).abs().max().item<double>(), 1e-6) << item.key();
        }
      }
    }
  }
  EXPECT_THROW(models::apply_activation_checkpointing(*make("qwen3-debug"), {"partial", 1}), UserError);
  EXPECT_THROW(models::apply_activation_checkpointing(*make("qwen3-debug"), {"full", 0}), UserError);
  models::ModelLoadOptions fused;
  fused.plan_overrides = {{"*.self_attn", "Qwen3Attention", "fused_qkv_attention"}};
  auto with_override = models::AutoModelForCausalLM::from_pretrained("qwen3-debug", fused);
  EXPECT_THROW(models::apply_activation_checkpointing(*with_override, {"selective", 1, false, "attention_core"}), UserError);
  EXPECT_THROW(models::apply_activation_checkpointing(*with_override, {"selective", 1, false, "matmuls"}), UserError);
  EXPECT_EQ(models::apply_activation_checkpointing(*with_override, {"full", 1}).size(), 4u);
  EXPECT_EQ(models::apply_activation_checkpointing(*with_override, {"selective", 1}).size(), 4u);
  {  // op keeps the fused projection's output as well: the override's own numbers
    auto reference = models::AutoModelForCausalLM::from_pretrained("qwen3-debug", fused);
    const models::CausalLMInput in = batch(reference->config(), 4);
    auto a = reference->forward(in), b = with_override->forward(in);
    EXPECT_EQ(a.loss.item<double>(), b.loss.item<double>());
    a.loss.backward();
    b.loss.backward();
    auto grads = with_override->named_parameters();
    for (const auto& item : reference->named_parameters()) {
      EXPECT_LE((item.value().grad() - grads[item.key()].grad()).abs().max().item<double>(), 1e-6) << item.key();
    }
  }
  // Without gradients (evaluation, decoding) nothing is recomputed and the output is the same.
  auto plain = make("qwen3-debug"), checkpointed = make("qwen3-debug");
  models::apply_activation_checkpointing(*checkpointed, {});
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(plain->forward(batch(plain->config(), 6)).logits, checkpointed->forward(batch(plain->config(), 6)).logits));
}

TEST(Memory, ChunkedLossEqualsThePlainLoss) {
  for (const std::string flavour : {"qwen3-debug", "llama-debug", "qwen3-moe-debug"}) {
    for (int64_t chunk : {1, 7, 1000}) {
      for (bool checkpointed : {false, true}) {
        SCOPED_TRACE(flavour + " chunk " + std::to_string(chunk) + (checkpointed ? " with checkpointing" : ""));
        auto plain = make(flavour), chunked = make(flavour);
        chunked->set_loss_chunk_tokens(chunk);
        if (checkpointed) models::apply_activation_checkpointing(*chunked, {});
        const models::CausalLMInput in = batch(plain->config(), 8);
        auto a = plain->forward(in), b = chunked->forward(in);
        EXPECT_FALSE(b.logits.defined());  // never made whole
        EXPECT_EQ(a.label_tokens, b.label_tokens);
        EXPECT_NEAR(b.lm_loss_sum.item<double>(), a.lm_loss_sum.item<double>(), 1e-6 * a.lm_loss_sum.item<double>());
        EXPECT_NEAR(b.loss.item<double>(), a.loss.item<double>(), 1e-6 * a.loss.item<double>());
        a.loss.backward();
        b.loss.backward();
        auto grads = chunked->named_parameters();
        for (const auto& item : plain->named_parameters()) {
          EXPECT_LE((item.value().grad() - grads[item.key()].grad()).abs().max().item<double>(), 1e-6) << item.key();
        }
      }
    }
  }
  // Without labels (decoding) the logits come out as usual.
  auto chunked = make("qwen3-debug");
  chunked->set_loss_chunk_tokens(5);
  models::CausalLMInput in = batch(chunked->config(), 9);
  in.labels = at::Tensor();
  EXPECT_TRUE(chunked->forward(in).logits.defined());
  EXPECT_THROW(chunked->set_loss_chunk_tokens(-1), UserError);
}

// SGD steps on 2 ranks (each its own rows) against the plain model on both ranks' rows.
std::vector<double> train(const testing::RankContext* ctx, const std::string& flavour, bool experts_parallel,
                          int64_t loss_chunk = 0, const std::string& checkpointing = "full") {
  auto model = make(flavour);
  if (ctx) {
    if (loss_chunk > 0) {
      model->set_loss_chunk_tokens(loss_chunk);
    } else {
      models::apply_activation_checkpointing(*model, {checkpointing, 1});
    }
    const auto mesh = mesh::init_device_mesh(ctx->world, "cpu", {ctx->world_size}, {"dp_shard"});
    fsdp::FullyShardOptions shard;
    shard.mesh = mesh;
    if (experts_parallel) {
      const auto experts = mesh::init_device_mesh(ctx->world, "cpu", {1, ctx->world_size}, {"edp", "ep"});
      ep::parallelize_experts(*model, experts["ep"]);
      fsdp::FullyShardOptions expert_shard;
      expert_shard.mesh = experts["edp"];
      for (auto* m : ep::expert_modules(*model)) fsdp::fully_shard(*m, expert_shard);
    }
    for (auto* layer : model->decoder_layers()) fsdp::fully_shard(*layer, shard);
    fsdp::fully_shard(*model, shard).set_reduce_op_type("sum");
  }
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  std::vector<double> losses;
  for (int s = 0; s < 4; ++s) {
    models::CausalLMInput in = batch(model->config(), 40 + s, 4, 10);
    in.output_router_logits = false;
    const double tokens = in.labels.narrow(1, 1, 9).ne(-100).sum().item<double>();
    if (ctx) {
      for (at::Tensor* t : {&in.input_ids, &in.labels, &in.attention_mask}) *t = t->narrow(0, ctx->rank * 2, 2);
    }
    opt.zero_grad();
    auto out = model->forward(in);
    (out.lm_loss_sum / tokens).backward();
    at::Tensor loss = out.lm_loss_sum.detach().reshape({1}) / tokens;
    if (ctx) ctx->world->all_reduce(loss).wait();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

TEST(Memory, ActivationCheckpointingTrainsLikeThePlainModelUnderFsdpAndExpertParallelism) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    for (const auto& [flavour, ep] : std::vector<std::pair<std::string, bool>>{{"qwen3-debug", false}, {"qwen3-moe-debug", false},
                                                                             {"qwen3-moe-debug", true}}) {
      const auto ref = train(nullptr, flavour, false);
      for (const std::string mode : {"full", "selective"}) {  // selective: the op policy
        SCOPED_TRACE(flavour + (ep ? " EP2 " : " FSDP2 ") + mode);
        const auto got = train(&ctx, flavour, ep, 0, mode);
        for (size_t s = 0; s < ref.size(); ++s) EXPECT_NEAR(got[s], ref[s], 1e-5 * ref[s]) << "step " << s;
      }
    }
  });
}

// Under FSDP a tied head is the embedding: every chunk and the lookup add to one gradient,
// which must be complete before the root unit reduce-scatters it.
TEST(Memory, ChunkedLossTrainsLikeThePlainModelUnderFsdp) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    for (const std::string flavour : {"qwen3-debug", "llama-debug"}) {
      SCOPED_TRACE(flavour);
      const auto ref = train(nullptr, flavour, false), got = train(&ctx, flavour, false, 6);
      for (size_t s = 0; s < ref.size(); ++s) EXPECT_NEAR(got[s], ref[s], 1e-5 * ref[s]) << "step " << s;
    }
  });
}

TEST(Memory, ActivationSwapKeepsTheNumbersAndCountsItsTraffic) {
  for (const std::string flavour : {"qwen3-debug", "qwen3-moe-debug"}) {
    SCOPED_TRACE(flavour);
    auto kept = make(flavour), swapped = make(flavour);
    models::apply_activation_checkpointing(*kept, {"full", 1});
    models::apply_activation_checkpointing(*swapped, {"full", 1, true});
    const models::CausalLMInput in = batch(kept->config(), 7);
    for (int pass = 1; pass <= 2; ++pass) {  // the pool is empty again after each backward
      auto a = kept->forward(in), b = swapped->forward(in);
      EXPECT_EQ(a.loss.item<double>(), b.loss.item<double>());
      a.loss.backward();
      b.loss.backward();
      auto grads = swapped->named_parameters();
      for (const auto& item : kept->named_parameters()) EXPECT_TRUE(item.value().grad().equal(grads[item.key()].grad())) << item.key();
      const models::ActivationSwapTraffic t = models::activation_swap_traffic(*swapped);
      const int64_t layers = kept->config().num_hidden_layers;
      const int64_t input_bytes = in.input_ids.numel() * kept->config().hidden_size * 4;
      EXPECT_EQ(t.stashed, pass * layers);
      EXPECT_EQ(t.bytes_out, pass * layers * input_bytes);
      EXPECT_EQ(t.bytes_in, t.bytes_out);
      EXPECT_EQ(t.prefetched, pass * (layers - 1));  // the last layer's input is fetched on demand
    }
  }
  EXPECT_EQ(models::activation_swap_traffic(*make("qwen3-debug")).stashed, 0);
  EXPECT_THROW(models::apply_activation_checkpointing(*make("qwen3-debug"), {"selective", 1, true}), UserError);
  // A forward whose graph is dropped without backward leaves nothing in the pool.
  auto model = make("qwen3-debug");
  models::apply_activation_checkpointing(*model, {"full", 1, true});
  model->forward(batch(model->config(), 8));
  auto out = model->forward(batch(model->config(), 9));
  out.loss.backward();
  EXPECT_EQ(models::activation_swap_traffic(*model).stashed, 8);
  EXPECT_EQ(models::activation_swap_traffic(*model).bytes_in, models::activation_swap_traffic(*model).bytes_out / 2);
}

}  // namespace
}  // namespace hyperparallel
