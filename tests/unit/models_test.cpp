// The HF model classes beyond the golden numbers: names, flavours, packing, save/load,
// deferred loading, plan_overrides, and the errors a user meets.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "hyperparallel/io/hf_checkpoint.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/platform/user_error.h"
#include "models/fused_rms_norm.h"
#include "models/rotary.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;
using hp::models::AutoModelForCausalLM;
using hp::models::CausalLMInput;
using hp::models::ModelLoadOptions;

namespace {

const std::string kFixtures = HP_SOURCE_DIR "/tests/fixtures/hf";

std::string temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("hp_models_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::set<std::string> parameter_names(torch::nn::Module& m) {
  std::set<std::string> names;
  for (const auto& item : m.named_parameters()) names.insert(item.key());
  return names;
}

// Runs `fn` and returns the UserError's message ("(no error)" if none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const hp::UserError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A copy of a fixture folder with config.json edited by `edit`.
std::string edited_fixture(const std::string& arch, const std::string& from, const std::string& to) {
  const std::string dir = temp_dir("edited_" + arch);
  fs::copy(kFixtures + "/" + arch + "/model.safetensors", dir + "/model.safetensors");
  std::string config = read_text(kFixtures + "/" + arch + "/config.json");
  const size_t at = config.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  config.replace(at, from.size(), to);
  std::ofstream(dir + "/config.json") << config;
  return dir;
}

double max_abs(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

CausalLMInput random_batch(int64_t vocab, int64_t batch, int64_t seq, uint64_t seed) {
  CausalLMInput in;
  auto gen = at::detail::createCPUGenerator(seed);
  in.input_ids = at::randint(vocab, {batch, seq}, gen, at::kLong);
  in.labels = in.input_ids.clone();
  return in;
}

}  // namespace

TEST(Models, ParameterNamesAreExactlyTheCheckpointKeys) {
  for (const std::string arch : {"llama", "qwen2", "qwen3", "qwen3_moe"}) {
    auto model = AutoModelForCausalLM::from_pretrained(kFixtures + "/" + arch);
    const auto names = hp::io::HfCheckpoint(kFixtures + "/" + arch).names();
    EXPECT_EQ(parameter_names(*model), std::set<std::string>(names.begin(), names.end())) << arch;
  }
  auto qwen3 = AutoModelForCausalLM::from_pretrained(kFixtures + "/qwen3");
  EXPECT_FALSE(parameter_names(*qwen3).count("lm_head.weight"));  // tied
  EXPECT_TRUE(parameter_names(*qwen3).count("model.layers.1.self_attn.k_norm.weight"));
  EXPECT_EQ(qwen3->named_modules()["model.layers.0.self_attn"]->name(), "Qwen3Attention");
  EXPECT_EQ(qwen3->decoder_layers().size(), 2u);
}

TEST(Models, DebugFlavoursBuildFromANameDeterministically) {
  for (const auto& name : hp::models::debug_flavour_names()) {
    SCOPED_TRACE(name);
    ModelLoadOptions options;
    options.seed = 7;
    auto a = AutoModelForCausalLM::from_pretrained(name, options);
    auto b = AutoModelForCausalLM::from_pretrained(name, options);
    options.seed = 8;
    auto c = AutoModelForCausalLM::from_pretrained(name, options);
    const auto& cfg = a->config();
    EXPECT_GE(cfg.num_hidden_layers, 2);
    EXPECT_LE(cfg.num_hidden_layers, 4);
    EXPECT_GE(cfg.hidden_size, 64);
    EXPECT_LE(cfg.hidden_size, 256);
    auto pb = b->named_parameters(), pc = c->named_parameters();
    bool any_differs = false;
    int64_t numel = 0;
    for (const auto& item : a->named_parameters()) {
      EXPECT_TRUE(at::equal(item.value(), pb[item.key()])) << item.key();
      any_differs |= !at::equal(item.value(), pc[item.key()]);
      numel += item.value().numel();
    }
    EXPECT_TRUE(any_differs);
    EXPECT_EQ(numel, cfg.parameter_count());
    // An untrained model predicts roughly uniformly: loss near ln(vocab).
    const auto out = a->forward(random_batch(cfg.vocab_size, 2, 16, 1));
    EXPECT_NEAR(out.lm_loss.item<double>(), std::log(static_cast<double>(cfg.vocab_size)), 0.5);
    if (cfg.num_experts > 0) {
      EXPECT_TRUE(out.aux_loss.defined());
    }
  }
}

TEST(Models, PackedRowsEqualTheSequencesRunAlone) {
  auto model = AutoModelForCausalLM::from_pretrained(kFixtures + "/qwen3_moe");
  CausalLMInput a = random_batch(512, 1, 10, 3), b = random_batch(512, 1, 14, 4);
  a.output_router_logits = b.output_router_logits = false;
  CausalLMInput packed;
  packed.input_ids = at::cat({a.input_ids, b.input_ids}, 1);
  packed.position_ids = at::cat({at::arange(10).view({1, -1}), at::arange(14).view({1, -1})}, 1);
  packed.output_router_logits = false;
  const at::Tensor logits = model->forward(packed).logits;
  EXPECT_LE(max_abs(logits.narrow(1, 0, 10), model->forward(a).logits), 1e-5);
  EXPECT_LE(max_abs(logits.narrow(1, 10, 14), model->forward(b).logits), 1e-5);
  packed.document_mask = false;  // without it the second document sees the first
  EXPECT_GT(max_abs(model->forward(packed).logits.narrow(1, 10, 14), model->forward(b).logits), 1e-2);
}

TEST(Models, SaveThenLoadGivesIdenticalTensorsSingleAndSharded) {
  for (const std::string arch : {"qwen3", "qwen3_moe", "llama3_rope"}) {
    SCOPED_TRACE(arch);
    auto model = AutoModelForCausalLM::from_pretrained(kFixtures + "/" + arch);
    for (const std::string max_shard : {"5GB", "100KB"}) {
      const std::string dir = temp_dir("save_" + arch);
      hp::models::SaveOptions save;
      save.max_shard_size = max_shard;
      const auto files = hp::models::save_pretrained(*model, dir, save);
      EXPECT_EQ(fs::exists(dir + "/model.safetensors.index.json"), max_shard == "100KB");
      EXPECT_GE(files.size(), max_shard == "100KB" ? 4u : 2u);
      auto back = AutoModelForCausalLM::from_pretrained(dir);
      auto original = model->named_parameters();
      for (const auto& item : back->named_parameters()) EXPECT_TRUE(at::equal(item.value(), original[item.key()])) << item.key();
      const auto config = hp::models::load_model_config(dir);
      EXPECT_EQ(config.rope_scaling.type, model->config().rope_scaling.type);
      EXPECT_EQ(config.tie_word_embeddings, model->config().tie_word_embeddings);
    }
  }
  // A built-in flavour saves a config that transformers' fields describe, and loads back.
  auto debug = AutoModelForCausalLM::from_pretrained("qwen3-moe-debug");
  const std::string dir = temp_dir("save_debug");
  hp::models::save_pretrained(*debug, dir);
  auto back = AutoModelForCausalLM::from_pretrained(dir);
  EXPECT_EQ(back->config().num_experts, 8);
  EXPECT_TRUE(at::equal(back->named_parameters()["model.layers.3.mlp.experts.7.up_proj.weight"],
                        debug->named_parameters()["model.layers.3.mlp.experts.7.up_proj.weight"]));
}

TEST(Models, DeferredInitThenLoadEqualsDirectLoad) {
  ModelLoadOptions deferred;
  deferred.deferred_init = true;
  auto model = AutoModelForCausalLM::from_pretrained(kFixtures + "/qwen2", deferred);
  hp::models::load_pretrained_weights(*model, kFixtures + "/qwen2");
  auto direct = AutoModelForCausalLM::from_pretrained(kFixtures + "/qwen2");
  auto expected = direct->named_parameters();
  for (const auto& item : model->named_parameters()) EXPECT_TRUE(at::equal(item.value(), expected[item.key()])) << item.key();
}

TEST(Models, PlanOverridesKeepParametersAndMatchTheOriginal) {
  for (const std::string arch : {"llama", "qwen2", "qwen3", "qwen3_moe"}) {
    SCOPED_TRACE(arch);
    auto reference = AutoModelForCausalLM::from_pretrained(kFixtures + "/" + arch);
    const std::string prefix = reference->config().class_prefix();
    ModelLoadOptions options;
    options.plan_overrides = {{"*.self_attn", prefix + "Attention", "fused_qkv_attention"},
                              {"*norm", prefix + "RMSNorm", "fused_rms_norm"}};
    auto fused = AutoModelForCausalLM::from_pretrained(kFixtures + "/" + arch, options);
    EXPECT_EQ(parameter_names(*fused), parameter_names(*reference));
    EXPECT_EQ(fused->named_modules()["model.layers.1.self_attn"]->name(), "FusedQKVAttention");
    EXPECT_EQ(fused->named_modules()["model.norm"]->name(), "FusedRMSNorm");
    const CausalLMInput in = random_batch(512, 2, 24, 5);
    auto a = reference->forward(in), b = fused->forward(in);
    EXPECT_LE(max_abs(a.logits, b.logits), 1e-6 * std::max(1.0, a.logits.abs().max().item<double>()));
    a.loss.backward();
    b.loss.backward();
    auto grads = reference->named_parameters();
    for (const auto& item : fused->named_parameters()) {
      const at::Tensor& g = grads[item.key()].grad();
      ASSERT_EQ(g.defined(), item.value().grad().defined()) << item.key();  // an expert no token chose
      if (!g.defined()) continue;
      EXPECT_LE(max_abs(item.value().grad(), g), 1e-6 * std::max(1.0, g.abs().max().item<double>())) << item.key();
    }
  }
}

// The fused norm's row kernels (vector lanes, a scalar tail, gw summed in blocks of rows)
// against the reference RMSNorm: widths that are and are not a multiple of the lanes, more
// rows than one block, on every thread.
TEST(Models, FusedRmsNormMatchesTheReferenceAtAnyWidth) {
  for (const int64_t width : {512, 100, 7}) {
    SCOPED_TRACE(width);
    hp::models::ParamFactory factory(false, 3, 0.02, at::kFloat);
    hp::models::RMSNorm reference("Qwen3RMSNorm", width, 1e-6, factory);
    reference.weight.data().uniform_(0.5, 1.5);
    hp::models::FusedRMSNorm fused(reference);
    const at::Tensor x = at::randn({3, 700, width}).requires_grad_(true);
    const at::Tensor gy = at::randn({3, 700, width});
    const at::Tensor y_ref = reference.forward(x), y = fused.forward(x);
    EXPECT_LE(max_abs(y, y_ref), 1e-6 * y_ref.abs().max().item<double>());
    const auto grads_ref = torch::autograd::grad({y_ref}, {x, reference.weight}, {gy});
    const auto grads = torch::autograd::grad({y}, {x, fused.weight}, {gy});
    for (size_t i = 0; i < 2; ++i) EXPECT_LE(max_abs(grads[i], grads_ref[i]), 1e-5 * grads_ref[i].abs().max().item<double>()) << i;
  }
}

// bf16 (mixed precision): the fused norm runs its fp32 kernels between casts; output and
// gradients agree with the reference's bf16 computation to a few bf16 roundings.
TEST(Models, FusedRmsNormInBf16AgreesWithTheReferenceToBf16Rounding) {
  hp::models::ParamFactory factory(false, 3, 0.02, at::kBFloat16);
  hp::models::RMSNorm reference("Qwen3RMSNorm", 512, 1e-6, factory);
  reference.weight.data().uniform_(0.5, 1.5);
  hp::models::FusedRMSNorm fused(reference);
  const at::Tensor x = at::randn({2, 300, 512}).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor gy = at::randn({2, 300, 512}).to(at::kBFloat16);
  const at::Tensor y_ref = reference.forward(x), y = fused.forward(x);
  ASSERT_EQ(y.scalar_type(), at::kBFloat16);
  // bf16 keeps 8 bits of mantissa: one rounding is up to 2^-8 of the value.
  EXPECT_LE(max_abs(y.to(at::kFloat), y_ref.to(at::kFloat)), 2.0 / 256 * y_ref.abs().max().item<double>());
  const auto grads_ref = torch::autograd::grad({y_ref}, {x, reference.weight}, {gy});
  const auto grads = torch::autograd::grad({y}, {x, fused.weight}, {gy});
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(grads[i].scalar_type(), at::kBFloat16) << i;
    const at::Tensor g = grads[i].to(at::kFloat), g_ref = grads_ref[i].to(at::kFloat);
    // Relative to the gradient's norm: the reference sums the weight gradient over 600 rows in
    // bf16 products, so single elements carry its rounding.
    EXPECT_LE((g - g_ref).norm().item<double>(), 2e-2 * g_ref.norm().item<double>()) << i;
  }
}

// The bf16 norm reads and writes bf16 rows directly: bit for bit the fp32 norm of the cast
// inputs, its output and gradients rounded once.
TEST(Models, FusedRmsNormInBf16IsTheFp32NormOfTheCastInputsRounded) {
  hp::models::ParamFactory factory(false, 3, 0.02, at::kBFloat16);
  hp::models::RMSNorm bf16_norm("Qwen3RMSNorm", 100, 1e-6, factory);
  bf16_norm.weight.data().uniform_(0.5, 1.5);
  hp::models::RMSNorm fp32_norm("Qwen3RMSNorm", 100, 1e-6, factory);
  fp32_norm.weight = bf16_norm.weight.detach().to(at::kFloat).requires_grad_(true);
  hp::models::FusedRMSNorm bf16_fused(bf16_norm), fp32_fused(fp32_norm);
  const at::Tensor x = at::randn({2, 150, 100}).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor x32 = x.detach().to(at::kFloat).requires_grad_(true);
  const at::Tensor gy = at::randn({2, 150, 100}).to(at::kBFloat16);
  const at::Tensor y = bf16_fused.forward(x), y32 = fp32_fused.forward(x32);
  EXPECT_TRUE(y.equal(y32.to(at::kBFloat16)));
  const auto grads = torch::autograd::grad({y}, {x, bf16_fused.weight}, {gy});
  const auto grads32 = torch::autograd::grad({y32}, {x32, fp32_fused.weight}, {gy.to(at::kFloat)});
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(grads[i].equal(grads32[i].to(at::kBFloat16))) << i;
}

TEST(Models, FusedAttentionMatchesAtLongSequencesWithPaddingAndPacking) {
  // Long enough for the causal query blocks (>= 512 positions), with right padding (as the
  // trainer pads) in one row and two packed documents in the other.
  auto reference = AutoModelForCausalLM::from_pretrained("qwen3-debug");
  ModelLoadOptions options;
  options.plan_overrides = {{"*.self_attn", "Qwen3Attention", "fused_qkv_attention"}};
  auto fused = AutoModelForCausalLM::from_pretrained("qwen3-debug", options);
  CausalLMInput in = random_batch(512, 2, 600, 9);
  in.attention_mask = at::ones({2, 600}, at::kLong);
  in.attention_mask[0].narrow(0, 563, 37).zero_();
  in.labels = in.input_ids.masked_fill(in.attention_mask.eq(0), -100);
  in.position_ids = at::stack({at::arange(600), at::cat({at::arange(250), at::arange(350)})});
  auto a = reference->forward(in), b = fused->forward(in);
  const at::Tensor real = in.attention_mask.to(at::kBool);
  EXPECT_LE(max_abs(a.logits.index({real}), b.logits.index({real})), 1e-6 * std::max(1.0, a.logits.abs().max().item<double>()));
  EXPECT_NEAR(a.loss.item<double>(), b.loss.item<double>(), 1e-6 * a.loss.item<double>());
  a.loss.backward();
  b.loss.backward();
  auto grads = reference->named_parameters();
  for (const auto& item : fused->named_parameters()) {
    const at::Tensor& g = grads[item.key()].grad();
    EXPECT_LE(max_abs(item.value().grad(), g), 1e-6 * std::max(1.0, g.abs().max().item<double>())) << item.key();
  }
}

TEST(Models, LinearRopeScalingDividesPositions) {
  // transformers' "linear" type: inv_freq / factor, i.e. position p behaves as p / factor.
  hp::models::ModelConfig plain = hp::models::debug_flavour_config("llama-debug");
  hp::models::ModelConfig linear = plain;
  linear.rope_scaling.type = "linear";
  linear.rope_scaling.factor = 4.0;
  const at::Tensor positions = at::arange(0, 64, 4).view({1, -1});
  const auto [cos_linear, sin_linear] = hp::models::rope_cos_sin(hp::models::rope_inv_freq(linear), positions, at::kFloat);
  const auto [cos_plain, sin_plain] = hp::models::rope_cos_sin(hp::models::rope_inv_freq(plain), positions / 4, at::kFloat);
  EXPECT_LE(max_abs(cos_linear, cos_plain), 1e-6);
  EXPECT_LE(max_abs(sin_linear, sin_plain), 1e-6);
  EXPECT_GT(max_abs(cos_linear, hp::models::rope_cos_sin(hp::models::rope_inv_freq(plain), positions, at::kFloat).first), 0.1);
}

TEST(Models, PlanOverrideMistakesListWhatExists) {
  const auto build = [](std::vector<hp::models::PlanOverride> overrides) {
    ModelLoadOptions options;
    options.plan_overrides = std::move(overrides);
    return AutoModelForCausalLM::from_pretrained("qwen3-debug", options);
  };
  std::string e = error_of([&] { build({{"*.self_attn", "Qwen3Attention", "flash_attention_9"}}); });
  EXPECT_NE(e.find("registered: fused_qkv_attention, fused_rms_norm"), std::string::npos) << e;
  e = error_of([&] { build({{"*.self_attn", "LlamaAttention", "fused_qkv_attention"}}); });
  EXPECT_NE(e.find("no module of type 'LlamaAttention'"), std::string::npos) << e;
  EXPECT_NE(e.find("Qwen3Attention"), std::string::npos) << e;
  e = error_of([&] { build({{"*.attention", "Qwen3Attention", "fused_qkv_attention"}}); });
  EXPECT_NE(e.find("has a name matching '*.attention'"), std::string::npos) << e;
  e = error_of([&] { build({{"*.self_attn", "Qwen3Attention", "fused_rms_norm"}}); });
  EXPECT_NE(e.find("fused_rms_norm replaces RMSNorm modules"), std::string::npos) << e;
  EXPECT_NE(e.find("plan_overrides[0]"), std::string::npos) << e;
  // A user's own replacement through their own registry.
  auto registry = std::make_shared<hp::models::ReplacementRegistry>(hp::models::ReplacementRegistry::with_builtins());
  int built = 0;
  registry->add("counting_norm", [&](torch::nn::Module& original, const hp::models::ModelConfig& config) {
    ++built;
    return hp::models::ReplacementRegistry::with_builtins().find("fused_rms_norm")(original, config);
  });
  ModelLoadOptions options;
  options.replacements = registry;
  options.plan_overrides = {{"model.layers.*.input_layernorm", "Qwen3RMSNorm", "counting_norm"}};
  AutoModelForCausalLM::from_pretrained("qwen3-debug", options);
  EXPECT_EQ(built, 4);
}

// transformers 5 writes rope_parameters {rope_theta, rope_type, ...}, dtype, layer_types and
// num_local_experts where 4.x wrote rope_theta, rope_scaling, torch_dtype and num_experts.
// Both spellings give the same model; a theta that is not the default shows it was read (a 5.x folder once ran
// silently with the default 10000).
TEST(Models, TransformersFiveConfigSpellingReadsTheSameRotarySettings) {
  const std::string old_style = edited_fixture("qwen3", "\"rope_theta\": 10000.0", "\"rope_theta\": 1000000.0");
  const std::string new_style = temp_dir("edited_qwen3_v5");
  fs::copy(kFixtures + "/qwen3/model.safetensors", new_style + "/model.safetensors");
  std::string config = read_text(kFixtures + "/qwen3/config.json");
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"rope_scaling\": null,\n", ""},
           {"\"rope_theta\": 10000.0,", "\"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": \"default\"},"},
           {"\"torch_dtype\": \"float32\"", "\"dtype\": \"float32\""},
           {"\"max_window_layers\": 28,", "\"layer_types\": [\"full_attention\", \"full_attention\"], \"max_window_layers\": 28,"}}) {
    const size_t at = config.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    config.replace(at, from.size(), to);
  }
  std::ofstream(new_style + "/config.json") << config;
  EXPECT_EQ(hp::models::load_model_config(new_style).rope_theta, 1e6);
  auto a = AutoModelForCausalLM::from_pretrained(old_style), b = AutoModelForCausalLM::from_pretrained(new_style);
  auto plain = AutoModelForCausalLM::from_pretrained(kFixtures + "/qwen3");
  const CausalLMInput batch = random_batch(512, 2, 32, 5);
  const at::Tensor logits = a->forward(batch).logits;
  EXPECT_TRUE(at::equal(logits, b->forward(batch).logits));
  EXPECT_GT(max_abs(logits, plain->forward(batch).logits), 1e-3) << "theta 1e6 and 1e4 must give other logits";
  // Saved again, the folder keeps transformers 5's dtype spelling.
  EXPECT_NE(hp::models::model_config_json(b->config(), "bfloat16").find("\"dtype\": \"bfloat16\""), std::string::npos);
  // llama3 scaling in either spelling.
  const std::string llama_config = read_text(kFixtures + "/llama3_rope/config.json");
  const auto v4 = hp::models::parse_model_config(llama_config, "v4");
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(llama_config);
  j["rope_parameters"] = j["rope_scaling"];
  j["rope_parameters"]["rope_theta"] = j["rope_theta"];
  j.erase("rope_scaling");
  j.erase("rope_theta");
  const auto v5 = hp::models::parse_model_config(j.dump(), "v5");
  EXPECT_EQ(v5.rope_scaling.type, "llama3");
  EXPECT_EQ(v5.rope_theta, v4.rope_theta);
  EXPECT_EQ(v5.rope_scaling.factor, v4.rope_scaling.factor);
  EXPECT_EQ(v5.rope_scaling.high_freq_factor, v4.rope_scaling.high_freq_factor);
  EXPECT_EQ(v5.rope_scaling.original_max_position_embeddings, v4.rope_scaling.original_max_position_embeddings);
  // Qwen3-MoE's expert count is num_local_experts in 5.x; both spellings must agree.
  const std::string moe_config = read_text(kFixtures + "/qwen3_moe/config.json");
  const auto respelled = [&](const std::string& to) {
    std::string text = moe_config;
    text.replace(text.find("\"num_experts\": 8"), std::string("\"num_experts\": 8").size(), to);
    return text;
  };
  EXPECT_EQ(hp::models::parse_model_config(respelled("\"num_local_experts\": 8"), "v5").num_experts, 8);
  EXPECT_EQ(hp::models::parse_model_config(respelled("\"num_local_experts\": 8, \"num_experts\": 8"), "v5").num_experts, 8);
  const std::string disagree = error_of([&] { hp::models::parse_model_config(respelled("\"num_local_experts\": 6, \"num_experts\": 8"), "v5"); });
  EXPECT_NE(disagree.find("num_experts = 8 disagrees with num_local_experts = 6; keep one of them"), std::string::npos) << disagree;
}

// Keys that change the math and that no family here implements are refused, never ignored.
TEST(Models, ConfigKeysThatChangeTheMathAndAreNotImplementedAreRefused) {
  const std::string base = read_text(kFixtures + "/qwen3/config.json");
  struct Case {
    std::string from, to, expect;
  };
  const std::vector<Case> cases = {
      {"\"rope_theta\": 10000.0", "\"rope_theta\": 10000.0, \"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": \"default\"}",
       "rope_theta = 10000.0 disagrees with rope_parameters.rope_theta = 1000000.0; keep one of them"},
      {"\"rope_theta\": 10000.0", "\"rope_parameters\": {\"rope_theta\": 1e6, \"rope_type\": \"yarn\", \"factor\": 4.0}",
       "rope_parameters type 'yarn' is not supported"},
      {"\"rope_theta\": 10000.0", "\"rope_parameters\": {\"full_attention\": {\"rope_theta\": 1e6, \"rope_type\": \"default\"}}",
       "rope_parameters per layer type ('full_attention': {...}) is not supported"},
      {"\"rope_theta\": 10000.0", "\"rope_parameters\": {\"rope_theta\": 1e6, \"rope_type\": \"default\", \"partial_rotary_factor\": 0.5}",
       "rope_parameters.partial_rotary_factor = 0.5 (rotary on part of each head) is not supported"},
      {"\"max_window_layers\": 28", "\"layer_types\": [\"full_attention\", \"sliding_attention\"]",
       "layer_types[1] = \"sliding_attention\" is not supported"},
      {"\"max_window_layers\": 28", "\"layer_types\": [\"full_attention\"]", "layer_types must list one entry per layer (2)"},
      {"\"attention_dropout\": 0.0", "\"attention_dropout\": 0.1", "attention_dropout = 0.1 is not supported (no dropout in attention); set it to 0.0"},
  };
  for (const auto& c : cases) {
    std::string config = base;
    const size_t at = config.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    config.replace(at, c.from.size(), c.to);
    const std::string message = error_of([&] { hp::models::parse_model_config(config, "config.json"); });
    EXPECT_NE(message.find(c.expect), std::string::npos) << c.to << ": " << message;
  }
}

TEST(Models, BadConfigsAndFoldersNameTheProblem) {
  const auto load = [](const std::string& dir) { return error_of([&] { AutoModelForCausalLM::from_pretrained(dir); }); };
  struct Case {
    std::string from, to, expect;
  };
  const std::vector<Case> cases = {
      {"\"LlamaForCausalLM\"", "\"GPT2LMHeadModel\"", "'GPT2LMHeadModel' is not supported; supported: LlamaForCausalLM"},
      {"\"hidden_size\": 64", "\"hidden_size\": \"64\"", "hidden_size = \"64\" must be an integer"},
      {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", "must be a multiple of num_key_value_heads 3"},
      {"\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"", "rope_scaling type 'yarn' is not supported"},
      {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "hidden_act 'gelu' is not supported"},
      {"\"vocab_size\": 512", "\"vocab_size\": 256", "has shape [512, 64], the config gives [256, 64]"},
      {"\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1", "unexpected [model.layers.1."},
      {"\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3", "missing [model.layers.2."},
      {"\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true", "(no error)"},  // an extra lm_head is ignored
      // Sizes no model has are refused before anything is allocated from them.
      {"\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1000000000", "num_hidden_layers = 1000000000 must be an integer in [1, 8192]"},
      {"\"vocab_size\": 512", "\"vocab_size\": 1000000000000", "vocab_size = 1000000000000 must be an integer in [1, 16777216]"},
      {"\"num_attention_heads\": 4", "\"num_attention_heads\": 1099511627776", "num_attention_heads = 1099511627776 must be an integer in [1, 8192]"},
      // Each size in bounds, their product absurd (the last key wins a duplicate in JSON).
      {"\"vocab_size\": 512", "\"vocab_size\": 512, \"num_hidden_layers\": 8000, \"intermediate_size\": 16000000",
       "describes a model of about 2.46e+13 parameters"},
  };
  for (const auto& c : cases) {
    const std::string dir = edited_fixture("llama3_rope", c.from, c.to);
    const std::string message = load(dir);
    EXPECT_NE(message.find(c.expect), std::string::npos) << c.to << ": " << message;
  }
  const std::string dir = edited_fixture("qwen2", "\"use_sliding_window\": false", "\"use_sliding_window\": true");
  EXPECT_NE(load(dir).find("use_sliding_window = true is not supported yet"), std::string::npos);
  EXPECT_NE(load("/nonexistent/model").find("neither a folder nor a built-in flavour (llama-debug"), std::string::npos);
  const std::string empty = temp_dir("no_weights");
  fs::copy(kFixtures + "/qwen3/config.json", empty + "/config.json");
  EXPECT_NE(load(empty).find("has neither model.safetensors nor model.safetensors.index.json"), std::string::npos);
  // Bad inputs at forward time.
  auto model = AutoModelForCausalLM::from_pretrained("llama-debug");
  CausalLMInput in = random_batch(512, 1, 4, 1);
  in.input_ids[0][2] = 9999;
  EXPECT_NE(error_of([&] { model->forward(in); }).find("token id 9999 is outside the vocabulary [0, 512)"), std::string::npos);
  hp::models::ModelLoadOptions gpu;
  gpu.device = "cuda";
  EXPECT_NE(error_of([&] { AutoModelForCausalLM::from_pretrained("llama-debug", gpu); }).find("device 'cuda' is not available"),
            std::string::npos);
}
