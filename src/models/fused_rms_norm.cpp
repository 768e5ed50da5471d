// One-pass RMSNorm kernels and their autograd function. See fused_rms_norm.h.
#include "fused_rms_norm.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The row kernels are compiled three times (AVX-512, AVX2 + FMA, baseline x86-64) and the
// loader picks the one the CPU runs (GCC's target_clones): the portable build's SSE2 code ran
// at 0.6x LibTorch's own AVX2 elementwise kernels. Sums run in kLanes independent float
// accumulators, which the vectoriser keeps in registers (a single accumulator is a serial
// chain it may not reorder), then add up once: fp32 throughout, as the reference computes.
// Elsewhere than x86-64 with GCC the kernels compile once, for the build's target.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HP_ROW_KERNEL __attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))
#else
#define HP_ROW_KERNEL
#endif
constexpr int64_t kLanes = 16;

float add_lanes(const float* lanes) {
  float sum = 0;
  for (int64_t l = 0; l < kLanes; ++l) sum += lanes[l];
  return sum;
}

// sum_j a_j * b_j * c_j (c null: sum_j a_j * b_j).
HP_ROW_KERNEL float sum_of_products(const float* a, const float* b, const float* c, int64_t d) {
  float lanes[kLanes] = {};
  const int64_t body = d - d % kLanes;
  for (int64_t j = 0; j < body; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += a[j + l] * b[j + l] * (c ? c[j + l] : 1.0f);
  }
  for (int64_t j = body; j < d; ++j) lanes[0] += a[j] * b[j] * (c ? c[j] : 1.0f);
  return add_lanes(lanes);
}

HP_ROW_KERNEL void scale_row(const float* x, const float* w, float r, float* y, int64_t d) {
  for (int64_t j = 0; j < d; ++j) y[j] = w[j] * (x[j] * r);
}

// gx = r * w * gy - x * c;  gw_acc += gy * x * r.
HP_ROW_KERNEL void backward_row(const float* x, const float* w, const float* gy, float r, float c, float* gx, float* gw_acc,
                                int64_t d) {
  for (int64_t j = 0; j < d; ++j) {
    gx[j] = r * w[j] * gy[j] - x[j] * c;
    gw_acc[j] += gy[j] * x[j] * r;
  }
}

// Rows of length d: y = w * x * r with r = 1 / sqrt(mean(x^2) + eps); saves r per row.
void rms_forward(const float* x, const float* w, float* y, float* r, int64_t rows, int64_t d, double eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* xi = x + i * d;
      const float mean_square = sum_of_products(xi, xi, nullptr, d) / static_cast<float>(d);
      r[i] = 1.0f / std::sqrt(mean_square + static_cast<float>(eps));
      scale_row(xi, w, r[i], y + i * d, d);
    }
  });
}

// gx_j = r * g_j - x_j * r^3 / d * sum_k g_k x_k  with g = w * gy;  gw_j = sum_rows gy_j * x_j * r.
// gw's sums run in float over blocks of kRowsPerFlush rows, each block added to a per-thread
// double sum (a float sum over thousands of rows would lose digits the reference keeps).
void rms_backward(const float* x, const float* w, const float* r, const float* gy, float* gx, float* gw, int64_t rows, int64_t d) {
  constexpr int64_t kRowsPerFlush = 64;
  const int64_t threads = at::get_num_threads();
  std::vector<std::vector<double>> partial(threads, std::vector<double>(d, 0.0));
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<double>& total = partial[at::get_thread_num()];
    std::vector<float> block(d);
    for (int64_t first = begin; first < end; first += kRowsPerFlush) {
      std::fill(block.begin(), block.end(), 0.0f);
      for (int64_t i = first; i < std::min(end, first + kRowsPerFlush); ++i) {
        const float* xi = x + i * d;
        const float* gyi = gy + i * d;
        const float ri = r[i];
        const float c = ri * ri * ri * sum_of_products(w, gyi, xi, d) / static_cast<float>(d);
        backward_row(xi, w, gyi, ri, c, gx + i * d, block.data(), d);
      }
      for (int64_t j = 0; j < d; ++j) total[j] += block[j];
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
  // bf16 (mixed precision computes in it): the fp32 kernels between one cast in and one out,
  // forward and backward, in place of the reference's casts and seven bf16/fp32 passes. The
  // output is rounded to bf16 once (the reference rounds the normalised row, then its product
  // with the weight), so it agrees with the reference to bf16 rounding, not bit for bit.
  if (x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16 && x.numel() > 0) {
    return RmsNormFunction::apply(x.to(at::kFloat), weight.to(at::kFloat), eps).to(at::kBFloat16);
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
