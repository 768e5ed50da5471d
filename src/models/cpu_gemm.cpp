// bf16 GEMMs through fp32 where the CPU lacks bf16 instructions. See cpu_gemm.h.
#include "cpu_gemm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "hyperparallel/platform/cpu_features.h"

namespace hyperparallel::models {
namespace {


at::Tensor fp32_gemm(const at::Tensor& a, const at::Tensor& b) {
  return at::mm(a.to(at::kFloat), b.to(at::kFloat)).to(at::kBFloat16);
}

// y = x Wᵀ + b with every product in fp32 and bf16 in and out; backward forms the products
// autograd's mm backward would (dX = dY W, dW = dYᵀ X, db = Σ dY) the same way.
// `bias` holds the bias or nothing (an undefined tensor cannot be a custom function's input).
struct Fp32GemmLinear : torch::autograd::Function<Fp32GemmLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, at::TensorList bias) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["bias"] = !bias.empty();
    const at::Tensor rows = x.reshape({-1, weight.size(1)});
    at::Tensor y = at::mm(rows.to(at::kFloat), weight.to(at::kFloat).t());
    if (!bias.empty()) y.add_(bias[0].to(at::kFloat));
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weight.size(0);
    return y.to(x.scalar_type()).view(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const bool with_bias = ctx->saved_data["bias"].toBool();
    const at::Tensor dy = grads[0].reshape({-1, weight.size(0)}).to(at::kFloat);
    torch::autograd::variable_list result(with_bias ? 3 : 2);
    if (ctx->needs_input_grad(0)) result[0] = dy.mm(weight.to(at::kFloat)).to(x.scalar_type()).view(x.sizes());
    if (ctx->needs_input_grad(1)) {
      result[1] = dy.t().mm(x.reshape({-1, weight.size(1)}).to(at::kFloat)).to(weight.scalar_type());
    }
    if (with_bias && ctx->needs_input_grad(2)) result[2] = dy.sum(0).to(weight.scalar_type());
    return result;
  }
};

}  // namespace

bool bf16_gemms_through_fp32() {
  static const bool slow_bf16 = !platform::cpu_features().fast_bf16();
  return slow_bf16;
}

bool gemm_through_fp32(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16 && a.device().is_cpu() && bf16_gemms_through_fp32();
}

at::Tensor gemm(const at::Tensor& a, const at::Tensor& b) { return gemm_through_fp32(a, b) ? fp32_gemm(a, b) : at::mm(a, b); }

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return gemm_through_fp32(x, weight) ? linear_through_fp32_gemm(x, weight, bias) : at::linear(x, weight, bias);
}

at::Tensor linear_through_fp32_gemm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const std::vector<at::Tensor> bias_if_any = bias.defined() ? std::vector<at::Tensor>{bias} : std::vector<at::Tensor>{};
  return Fp32GemmLinear::apply(x, weight, at::TensorList(bias_if_any));
}

}  // namespace hyperparallel::models
