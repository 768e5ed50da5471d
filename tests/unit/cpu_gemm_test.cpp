// bf16 linears through the fp32 GEMM (models/cpu_gemm.h): the same numbers as a bf16 GEMM
// with fp32 sums — outputs and all three gradients within bf16's rounding of an fp64
// reference, bf16 in and out — and the same as LibTorch's own bf16 linear to that rounding.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "models/cpu_gemm.h"

namespace hyperparallel {
namespace {

// Largest |got - want| relative to the largest |want|: bf16 keeps 8 significant bits.
double relative_error(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kDouble) - want).abs().max().item<double>() / want.abs().max().item<double>();
}

TEST(Models, Bf16LinearThroughTheFp32GemmMatchesABf16GemmWithFp32Sums) {
  auto gen = at::detail::createCPUGenerator(11);
  const at::Tensor x0 = at::randn({3, 5, 384}, gen).to(at::kBFloat16), w0 = at::randn({48, 384}, gen).to(at::kBFloat16);
  const at::Tensor b0 = at::randn({48}, gen).to(at::kBFloat16), r = at::randn({3, 5, 48}, gen, at::kDouble);
  const at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
  const at::Tensor y = models::linear_through_fp32_gemm(x, w, b);
  ASSERT_EQ(y.scalar_type(), at::kBFloat16);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{3, 5, 48}));
  (y.to(at::kDouble) * r).sum().backward();
  // fp64 references from the same bf16 values.
  const at::Tensor xd = x0.to(at::kDouble).reshape({15, 384}), wd = w0.to(at::kDouble), rd = r.reshape({15, 48});
  const at::Tensor y_ref = (xd.mm(wd.t()) + b0.to(at::kDouble)).reshape({3, 5, 48});
  constexpr double kBf16 = 1.0 / 256;
  EXPECT_LE(relative_error(y, y_ref), kBf16);
  EXPECT_GT(relative_error(y, y_ref), 0) << "no rounding to bf16 at all";
  EXPECT_LE(relative_error(x.grad(), rd.mm(wd).reshape({3, 5, 384})), kBf16);
  EXPECT_LE(relative_error(w.grad(), rd.t().mm(xd)), kBf16);
  EXPECT_LE(relative_error(b.grad(), rd.sum(0)), kBf16);
  for (const auto& g : {x.grad(), w.grad(), b.grad()}) EXPECT_EQ(g.scalar_type(), at::kBFloat16);
  // LibTorch's bf16 linear (fp32 sums on every CPU LibTorch 2.11 runs on) agrees to the rounding.
  EXPECT_LE(relative_error(y, at::linear(x0, w0, b0).to(at::kDouble)), 2 * kBf16);
  // No bias, 2-D input, no gradient wanted for the weight.
  const at::Tensor x2 = x0.reshape({15, 384}).clone().requires_grad_();
  const at::Tensor y2 = models::linear_through_fp32_gemm(x2, w0, at::Tensor());
  EXPECT_LE(relative_error(y2, xd.mm(wd.t())), kBf16);
  y2.to(at::kFloat).sum().backward();
  EXPECT_LE(relative_error(x2.grad(), at::ones({15, 48}, at::kDouble).mm(wd)), kBf16);
}

}  // namespace
}  // namespace hyperparallel
