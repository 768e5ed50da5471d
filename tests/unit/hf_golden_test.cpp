// Golden tests: our models against outputs of the real Hugging Face transformers code
// (tests/fixtures/hf/README.md says how they were made; scripts/make_hf_fixtures.py makes a
// set with the installed transformers, e.g. tests/fixtures/hf5). The fixture root comes from
// HP_HF_FIXTURES when set: a folder of architecture folders, every one of which is checked
// (finding none fails), or one architecture folder. Tolerances: logits 1e-4 absolute, losses
// 1e-5 relative, gradients and router logits 1e-5 absolute (fp32 vs fp64 of the same HF code
// differ by up to 3.4e-6 on logits).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "hyperparallel/io/safetensors.h"
#include "hyperparallel/models/auto_model.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;
using hp::models::AutoModelForCausalLM;
using hp::models::CausalLMInput;

namespace {

std::string fixture_root() {
  const char* env = std::getenv("HP_HF_FIXTURES");
  return env && *env ? env : HP_SOURCE_DIR "/tests/fixtures/hf";
}

bool is_architecture_dir(const fs::path& dir) {
  return fs::exists(dir / "config.json") && fs::exists(dir / "golden.safetensors");
}

std::vector<std::string> fixture_dirs() {
  std::vector<std::string> dirs;
  if (!fs::is_directory(fixture_root())) return dirs;
  if (is_architecture_dir(fixture_root())) return {fixture_root()};
  for (const auto& entry : fs::directory_iterator(fixture_root())) {
    if (is_architecture_dir(entry.path())) dirs.push_back(entry.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

double max_abs(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }
double rel(const at::Tensor& a, const at::Tensor& b) {
  return std::abs(a.item<double>() - b.item<double>()) / std::max(1e-12, std::abs(b.item<double>()));
}

struct Case {
  CausalLMInput input;
  at::Tensor logits_mask;  // [B, T] rows/positions to compare
};

Case make_case(hp::io::SafetensorsFile& golden, int n) {
  const std::string s = "_case" + std::to_string(n);
  Case c;
  c.input.input_ids = golden.read("input_ids" + s);
  c.input.labels = golden.read("labels" + s);
  if (golden.contains("attention_mask" + s) && n == 2) c.input.attention_mask = golden.read("attention_mask" + s);
  if (golden.contains("position_ids" + s)) c.input.position_ids = golden.read("position_ids" + s);
  c.logits_mask = c.input.attention_mask.defined() ? c.input.attention_mask.to(at::kBool) : at::ones_like(c.input.input_ids, at::kBool);
  return c;
}

double masked_logits_diff(const at::Tensor& ours, const at::Tensor& ref, const at::Tensor& mask) {
  return max_abs(ours.index({mask}), ref.index({mask}));
}

void check_architecture(const std::string& dir, const std::vector<hp::models::PlanOverride>& overrides, double logits_tol) {
  SCOPED_TRACE(dir);
  hp::io::SafetensorsFile golden(dir + "/golden.safetensors");
  hp::models::ModelLoadOptions options;
  options.plan_overrides = overrides;
  auto model = AutoModelForCausalLM::from_pretrained(dir, options);
  const bool moe = model->config().num_experts > 0;

  // case 1: plain batch; loss, logits, router logits, aux loss and gradients.
  Case c1 = make_case(golden, 1);
  auto out = model->forward(c1.input);
  std::printf("%s%s: case1 logits max |diff| %.3g, loss rel diff %.3g\n", fs::path(dir).filename().c_str(),
              overrides.empty() ? "" : " (plan_overrides)", max_abs(out.logits, golden.read("logits_case1")),
              rel(out.loss, golden.read("loss_case1")));
  EXPECT_LE(max_abs(out.logits, golden.read("logits_case1")), logits_tol);
  EXPECT_LE(rel(out.loss, golden.read("loss_case1")), 1e-5);
  EXPECT_LE(rel(out.lm_loss, golden.read("lm_loss_case1")), 1e-5);
  if (moe) {
    EXPECT_LE(rel(out.aux_loss, golden.read("aux_loss_case1")), 1e-5);
    ASSERT_EQ(out.router_logits.size(), 2u);
    for (int l = 0; l < 2; ++l) {
      EXPECT_LE(max_abs(out.router_logits[l], golden.read("router_logits_case1.layer" + std::to_string(l))), 1e-5);
    }
  }
  out.loss.backward();
  auto params = model->named_parameters();
  int grads_checked = 0;
  for (const auto& e : golden.entries()) {
    if (e.name.rfind("grad.", 0) != 0) continue;
    const std::string name = e.name.substr(5);
    ASSERT_TRUE(params.contains(name)) << name;
    EXPECT_LE(max_abs(params[name].grad(), golden.read(e.name)), 1e-5) << name;
    ++grads_checked;
  }
  EXPECT_GE(grads_checked, 4);

  // case 2: left padding; compare logits where the mask is 1.
  Case c2 = make_case(golden, 2);
  out = model->forward(c2.input);
  EXPECT_LE(masked_logits_diff(out.logits, golden.read("logits_case2"), c2.logits_mask), logits_tol);
  EXPECT_LE(rel(out.loss, golden.read("loss_case2")), 1e-5);
  if (moe) {
    EXPECT_LE(rel(out.aux_loss, golden.read("aux_loss_case2")), 1e-5);
  }

  // case 3: packed position_ids and no attention mask. The golden metadata says what HF did:
  // "causal" (4.51, and a set without the key): attention causal across the whole row;
  // "document" (5.x's training forward, no cache): documents inferred from the position_ids,
  // no attention across them, which is what our document_mask does.
  const auto& meta = golden.metadata();
  const std::string case3_attention = meta.count("case3_attention") ? meta.at("case3_attention") : "causal";
  ASSERT_TRUE(case3_attention == "causal" || case3_attention == "document") << "case3_attention = " << case3_attention;
  Case c3 = make_case(golden, 3);
  c3.input.document_mask = case3_attention == "document";
  out = model->forward(c3.input);
  std::printf("%s%s: case3 (%s) logits max |diff| %.3g, loss rel diff %.3g\n", fs::path(dir).filename().c_str(),
              overrides.empty() ? "" : " (plan_overrides)", case3_attention.c_str(), max_abs(out.logits, golden.read("logits_case3")),
              rel(out.loss, golden.read("loss_case3")));
  EXPECT_LE(max_abs(out.logits, golden.read("logits_case3")), logits_tol);
  EXPECT_LE(rel(out.loss, golden.read("loss_case3")), 1e-5);
  if (moe) {
    EXPECT_LE(rel(out.aux_loss, golden.read("aux_loss_case3")), 1e-5);
  }

  // case 4: true packing (HF given a block-diagonal mask) equals our position_ids path.
  Case c4 = make_case(golden, 4);
  c4.input.output_router_logits = false;  // HF ran case 4 without the aux term
  out = model->forward(c4.input);
  EXPECT_LE(max_abs(out.logits, golden.read("logits_case4")), logits_tol);
  EXPECT_LE(rel(out.loss, golden.read("loss_case4")), 1e-5);
  EXPECT_LE(rel(out.lm_loss, golden.read("lm_loss_case4")), 1e-5);
}

// One architecture's failure to load is reported and the others are still checked.
template <typename F>
void for_each_architecture(F check) {
  const auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty()) << "no architecture folders (config.json + golden.safetensors) under " << fixture_root();
  for (const auto& dir : dirs) {
    try {
      check(dir);
    } catch (const std::exception& e) {
      ADD_FAILURE() << dir << ": " << e.what();
    }
  }
}

}  // namespace

TEST(HfGolden, EveryArchitectureMatchesTransformers) {
  for_each_architecture([](const std::string& dir) { check_architecture(dir, {}, 1e-4); });
}

TEST(HfGolden, PlanOverridesMatchTransformersToo) {
  for_each_architecture([](const std::string& dir) {
    const std::string prefix = hp::models::load_model_config(dir).class_prefix();
    check_architecture(dir, {{"*.self_attn", prefix + "Attention", "fused_qkv_attention"}, {"*", prefix + "RMSNorm", "fused_rms_norm"}},
                       1e-4);
  });
}
