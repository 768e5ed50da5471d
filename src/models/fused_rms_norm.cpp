// One-pass RMSNorm kernels and their autograd function. See fused_rms_norm.h.
#include "fused_rms_norm.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows of length d: y = w * x * r with r = 1 / sqrt(mean(x^2) + eps); saves r per row.
void rms_forward(const float* x, const float* w, float* y, float* r, int64_t rows, int64_t d, double eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* xi = x + i * d;
      float* yi = y + i * d;
      double sum = 0;
      for (int64_t j = 0; j < d; ++j) sum += static_cast<double>(xi[j]) * xi[j];
      const float ri = static_cast<float>(1.0 / std::sqrt(sum / d + eps));
      r[i] = ri;
      for (int64_t j = 0; j < d; ++j) yi[j] = w[j] * (xi[j] * ri);
    }
  });
}

// gx_j = r * g_j - x_j * r^3 / d * sum_k g_k x_k  with g = w * gy;  gw_j = sum_rows gy_j * x_j * r.
void rms_backward(const float* x, const float* w, const float* r, const float* gy, float* gx, float* gw, int64_t rows, int64_t d) {
  const int64_t threads = at::get_num_threads();
  std::vector<std::vector<double>> partial(threads, std::vector<double>(d, 0.0));
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<double>& acc = partial[at::get_thread_num()];
    for (int64_t i = begin; i < end; ++i) {
      const float* xi = x + i * d;
      const float* gyi = gy + i * d;
      float* gxi = gx + i * d;
      const double ri = r[i];
      double dot = 0;
      for (int64_t j = 0; j < d; ++j) dot += static_cast<double>(w[j]) * gyi[j] * xi[j];
      const double c = ri * ri * ri * dot / d;
      for (int64_t j = 0; j < d; ++j) {
        gxi[j] = static_cast<float>(ri * w[j] * gyi[j] - xi[j] * c);
        acc[j] += static_cast<double>(gyi[j]) * xi[j] * ri;
      }
    }
  });
  for (int64_t j = 0; j < d; ++j) {
    double s = 0;
    for (const auto& p : partial) s += p[j];
    gw[j] = static_cast<float>(s);
  }
}

struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    const at::Tensor xc = x.contiguous();
    const at::Tensor wc = weight.contiguous();
    const int64_t d = x.size(-1), rows = x.numel() / std::max<int64_t>(d, 1);
    at::Tensor y = at::empty_like(xc);
    at::Tensor r = at::empty({rows}, x.options());
    rms_forward(xc.data_ptr<float>(), wc.data_ptr<float>(), y.data_ptr<float>(), r.data_ptr<float>(), rows, d, eps);
    ctx->save_for_backward({xc, wc, r});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& r = saved[2];
    const at::Tensor gy = grads[0].contiguous();
    const int64_t d = x.size(-1), rows = r.numel();
    at::Tensor gx = at::empty_like(x);
    at::Tensor gw = at::empty_like(w);
    rms_backward(x.data_ptr<float>(), w.data_ptr<float>(), r.data_ptr<float>(), gy.data_ptr<float>(), gx.data_ptr<float>(),
                 gw.data_ptr<float>(), rows, d);
    return {gx, gw, at::Tensor()};
  }
};

}  // namespace

FusedRMSNorm::FusedRMSNorm(const RMSNorm& original) : NormModule("FusedRMSNorm"), eps(original.eps) {
  weight = register_parameter("weight", original.weight);
}

at::Tensor FusedRMSNorm::forward(const at::Tensor& x) {
  if (x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat && x.numel() > 0) {
    return RmsNormFunction::apply(x, weight, eps);
  }
  const at::Tensor h = x.to(at::kFloat);
  return weight * (h * at::rsqrt(h.pow(2).mean(-1, true) + eps)).to(x.scalar_type());
}

std::shared_ptr<torch::nn::Module> make_fused_rms_norm(torch::nn::Module& original, const ModelConfig&) {
  auto* norm = dynamic_cast<RMSNorm*>(&original);
  if (!norm) throw UserError("fused_rms_norm replaces RMSNorm modules, not " + original.name());
  return std::make_shared<FusedRMSNorm>(*norm);
}

}  // namespace hyperparallel::models
