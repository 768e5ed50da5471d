// The fused SwiGLU (models/fused_swiglu.h): its kernels at every vector width against SiLU
// times up and autograd's gradients, bf16 against the reference's bf16 computation, and the
// fused_swiglu_mlp override in whole models.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "hyperparallel/models/auto_model.h"
#include "models/fused_swiglu.h"
#include "models/softmax_rows.h"

namespace hp = hyperparallel;

namespace {

double max_abs(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// Every element of a bf16 tensor within one bf16 rounding (2^-8 relative) of the exact fp32 values.
bool within_one_bf16_rounding(const at::Tensor& bf16, const at::Tensor& exact) {
  return (bf16.to(at::kFloat) - exact).abs().le(exact.abs() / 256).all().item<bool>();
}

// silu(g) * u and its gradients by ATen's ops and autograd: the reference.
struct Reference {
  at::Tensor h, dg, du;
};
Reference reference(const at::Tensor& g_in, const at::Tensor& u_in, const at::Tensor& dh) {
  const at::Tensor g = g_in.detach().requires_grad_(true), u = u_in.detach().requires_grad_(true);
  const at::Tensor h = at::silu(g) * u;
  const auto grads = torch::autograd::grad({h}, {g, u}, {dh});
  return {h.detach(), grads[0], grads[1]};
}

}  // namespace

// Lengths around the lane counts (the tails), values from -30 to 30 (sigmoid near 0 and 1).
TEST(Models, SwigluKernelsMatchSiluTimesUpAtEveryWidth) {
  for (const int lanes : hp::models::softmax_row_widths()) {
    for (const int64_t n : {1, 15, 16, 17, 1000}) {
      SCOPED_TRACE(std::to_string(lanes) + " lanes, " + std::to_string(n) + " elements");
      const at::Tensor g = at::randn({n}) * 8, u = at::randn({n}), dh = at::randn({n});
      const Reference want = reference(g, u, dh);
      at::Tensor h = at::empty({n}), dg = at::empty({n}), du = at::empty({n});
      hp::models::swiglu_forward(g.data_ptr<float>(), u.data_ptr<float>(), h.data_ptr<float>(), n, lanes);
      hp::models::swiglu_backward(g.data_ptr<float>(), u.data_ptr<float>(), dh.data_ptr<float>(), dg.data_ptr<float>(),
                                  du.data_ptr<float>(), n, lanes);
      EXPECT_LE(max_abs(h, want.h), 1e-6 * want.h.abs().max().item<double>());
      EXPECT_LE(max_abs(dg, want.dg), 1e-6 * want.dg.abs().max().item<double>());
      EXPECT_LE(max_abs(du, want.du), 1e-6 * want.du.abs().max().item<double>());
    }
  }
}

// Far out in the tails the sigmoid is exactly 0 or 1 and nothing overflows; NaN stays NaN.
TEST(Models, SwigluKeepsLargeInputsFiniteAndNaNNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor g = at::tensor({-1000.0f, -90.0f, 90.0f, 1000.0f, nan}), u = at::ones({5});
  const at::Tensor h = hp::models::swiglu(g, u);
  EXPECT_EQ(h[0].item<float>(), 0.0f);
  EXPECT_EQ(h[1].item<float>(), 0.0f);
  EXPECT_EQ(h[2].item<float>(), 90.0f);
  EXPECT_EQ(h[3].item<float>(), 1000.0f);
  EXPECT_TRUE(std::isnan(h[4].item<float>()));
}

// bf16: one rounding of the fp32 result, where the reference rounds silu(g) and the product.
TEST(Models, SwigluInBf16AgreesWithTheReferenceToBf16Rounding) {
  at::manual_seed(11);
  const at::Tensor g = (at::randn({3, 333}) * 4).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor u = at::randn({3, 333}).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor dh = at::randn({3, 333}).to(at::kBFloat16);
  const at::Tensor h = hp::models::swiglu(g, u);
  ASSERT_EQ(h.scalar_type(), at::kBFloat16);
  const auto grads = torch::autograd::grad({h}, {g, u}, {dh});
  // The exact function of the bf16 inputs, in fp32; the reference's own bf16 computation.
  const Reference exact = reference(g.to(at::kFloat), u.to(at::kFloat), dh.to(at::kFloat));
  const Reference bf16 = reference(g, u, dh);
  EXPECT_TRUE(within_one_bf16_rounding(h, exact.h));
  for (const auto& [have, want, ref] : {std::tuple{grads[0], exact.dg, bf16.dg}, std::tuple{grads[1], exact.du, bf16.du}}) {
    ASSERT_EQ(have.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(within_one_bf16_rounding(have, want));
    EXPECT_LE(max_abs(have.to(at::kFloat), ref.to(at::kFloat)), 4.0 / 256 * ref.to(at::kFloat).abs().max().item<double>());
  }
  // The reference rounds twice: it is not within one rounding everywhere (so the check above
  // can fail).
  EXPECT_FALSE(within_one_bf16_rounding(bf16.dg, exact.dg) && within_one_bf16_rounding(bf16.h, exact.h));
}

// The override in whole models: the same parameters, logits and gradients to float rounding.
TEST(Models, FusedSwigluMlpKeepsParametersAndMatchesTheOriginal) {
  for (const std::string flavour : {"llama-debug", "qwen3-debug"}) {
    SCOPED_TRACE(flavour);
    auto original = hp::models::AutoModelForCausalLM::from_pretrained(flavour);
    hp::models::ModelLoadOptions options;
    options.plan_overrides = {{"*.mlp", original->config().class_prefix() + "MLP", "fused_swiglu_mlp"}};
    auto fused = hp::models::AutoModelForCausalLM::from_pretrained(flavour, options);
    EXPECT_EQ(fused->named_modules()["model.layers.1.mlp"]->name(), "FusedSwiGLUMlp");
    EXPECT_EQ(fused->named_parameters().keys(), original->named_parameters().keys());
    hp::models::CausalLMInput in;
    in.input_ids = at::randint(original->config().vocab_size, {2, 40}, at::kLong);
    in.labels = in.input_ids;
    auto a = original->forward(in), b = fused->forward(in);
    EXPECT_LE(max_abs(a.logits, b.logits), 1e-6 * std::max(1.0, a.logits.abs().max().item<double>()));
    a.loss.backward();
    b.loss.backward();
    auto grads = original->named_parameters();
    for (const auto& item : fused->named_parameters()) {
      const at::Tensor& g = grads[item.key()].grad();
      EXPECT_LE(max_abs(item.value().grad(), g), 1e-5 * std::max(1.0, g.abs().max().item<double>())) << item.key();
    }
  }
  // Only gated MLPs: anything else names what it replaces.
  hp::models::ModelLoadOptions wrong;
  wrong.plan_overrides = {{"*.self_attn", "Qwen3Attention", "fused_swiglu_mlp"}};
  try {
    hp::models::AutoModelForCausalLM::from_pretrained("qwen3-debug", wrong);
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("fused_swiglu_mlp replaces gated MLP modules (e.g. Qwen3MLP), not Qwen3Attention"),
              std::string::npos)
        << e.what();
  }
}
