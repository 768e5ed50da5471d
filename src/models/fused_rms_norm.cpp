// One-pass RMSNorm kernels and their autograd function. See fused_rms_norm.h.
#include "fused_rms_norm.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

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

// bf16 rows go through fp32 scratch rows: widened exactly, computed by the fp32 row kernels,
// rounded once (c10::BFloat16's rounding, as a cast of the fp32 result rounds).
HP_ROW_KERNEL void widen_row(const at::BFloat16* in, float* out, int64_t d) {
  for (int64_t j = 0; j < d; ++j) out[j] = static_cast<float>(in[j]);
}
HP_ROW_KERNEL void round_row(const float* in, at::BFloat16* out, int64_t d) {
  for (int64_t j = 0; j < d; ++j) out[j] = at::BFloat16(in[j]);
}

// Row i of a [rows, d] tensor of T as fp32: the row itself, or widened into `scratch`.
template <typename T>
const float* fp32_row(const T* base, int64_t i, int64_t d, float* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    return base + i * d;
  } else {
    widen_row(base + i * d, scratch, d);
    return scratch;
  }
}

// Where row i of the output is written in fp32 (the row itself, or scratch), and its store.
template <typename T>
float* fp32_out(T* base, int64_t i, int64_t d, float* scratch) {
  if constexpr (std::is_same_v<T, float>) return base + i * d; else return scratch;
}
template <typename T>
void store_row(const float* row, T* base, int64_t i, int64_t d) {
  if constexpr (!std::is_same_v<T, float>) round_row(row, base + i * d, d);
}

// Rows of length d: y = w * x * r with r = 1 / sqrt(mean(x^2) + eps); saves r per row. w is fp32.
template <typename T>
void rms_forward(const T* x, const float* w, T* y, float* r, int64_t rows, int64_t d, double eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> x_row(std::is_same_v<T, float> ? 0 : d), y_row(x_row.size());
    for (int64_t i = begin; i < end; ++i) {
      const float* xi = fp32_row(x, i, d, x_row.data());
      const float mean_square = sum_of_products(xi, xi, nullptr, d) / static_cast<float>(d);
      r[i] = 1.0f / std::sqrt(mean_square + static_cast<float>(eps));
      float* yi = fp32_out(y, i, d, y_row.data());
      scale_row(xi, w, r[i], yi, d);
      store_row(yi, y, i, d);
    }
  });
}

// gx_j = r * g_j - x_j * r^3 / d * sum_k g_k x_k  with g = w * gy;  gw_j = sum_rows gy_j * x_j * r.
// gw's sums run in float over blocks of kRowsPerFlush rows, each block added to a per-thread
// double sum (a float sum over thousands of rows would lose digits the reference keeps).
template <typename T>
void rms_backward(const T* x, const float* w, const float* r, const T* gy, T* gx, float* gw, int64_t rows, int64_t d) {
  constexpr int64_t kRowsPerFlush = 64;
  const int64_t threads = at::get_num_threads();
  std::vector<std::vector<double>> partial(threads, std::vector<double>(d, 0.0));
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<double>& total = partial[at::get_thread_num()];
    std::vector<float> block(d);
    std::vector<float> x_row(std::is_same_v<T, float> ? 0 : d), gy_row(x_row.size()), gx_row(x_row.size());
    for (int64_t first = begin; first < end; first += kRowsPerFlush) {
      std::fill(block.begin(), block.end(), 0.0f);
      for (int64_t i = first; i < std::min(end, first + kRowsPerFlush); ++i) {
        const float* xi = fp32_row(x, i, d, x_row.data());
        const float* gyi = fp32_row(gy, i, d, gy_row.data());
        const float ri = r[i];
        const float c = ri * ri * ri * sum_of_products(w, gyi, xi, d) / static_cast<float>(d);
        float* gxi = fp32_out(gx, i, d, gx_row.data());
        backward_row(xi, w, gyi, ri, c, gxi, block.data(), d);
        store_row(gxi, gx, i, d);
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

// The element pointer of a contiguous fp32 or bf16 tensor.
template <typename T>
T* elements(const at::Tensor& t) {
  return t.data_ptr<T>();
}

// x and y in T (fp32 or bf16), the weight's math in fp32 (a bf16 weight is widened: d values).
template <typename T>
struct RmsNormFunction : torch::autograd::Function<RmsNormFunction<T>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    const at::Tensor xc = x.contiguous();
    const at::Tensor wc = weight.contiguous().to(at::kFloat);
    const int64_t d = x.size(-1), rows = x.numel() / std::max<int64_t>(d, 1);
    at::Tensor y = at::empty_like(xc);
    at::Tensor r = at::empty({rows}, x.options().dtype(at::kFloat));
    rms_forward(elements<T>(xc), wc.data_ptr<float>(), elements<T>(y), r.data_ptr<float>(), rows, d, eps);
    ctx->save_for_backward({xc, wc, r});
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& r = saved[2];
    const at::Tensor gy = grads[0].contiguous().to(x.scalar_type());
    const int64_t d = x.size(-1), rows = r.numel();
    at::Tensor gx = at::empty_like(x);
    at::Tensor gw = at::empty_like(w);
    rms_backward(elements<T>(x), w.data_ptr<float>(), r.data_ptr<float>(), elements<T>(gy), elements<T>(gx), gw.data_ptr<float>(), rows, d);
    const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    return {gx, gw.to(weight_dtype), at::Tensor()};
  }
};

}  // namespace

FusedRMSNorm::FusedRMSNorm(const RMSNorm& original) : NormModule("FusedRMSNorm"), eps(original.eps) {
  weight = register_parameter("weight", original.weight);
}

at::Tensor FusedRMSNorm::forward(const at::Tensor& x) {
  if (x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat && x.numel() > 0) {
    return RmsNormFunction<float>::apply(x, weight, eps);
  }
  // bf16 (mixed precision computes in it): each row widened to fp32 in cache, the fp32 kernels,
  // the output rounded once, forward and backward, in place of the reference's casts and seven
  // bf16/fp32 passes: the bits of the fp32 function of the cast inputs, rounded (no [tokens x
  // hidden] fp32 copies: they were 5 % of the bf16 step). The reference rounds the normalised
  // row, then its product with the weight, so this agrees with it to bf16 rounding.
  if (x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16 && x.numel() > 0) {
    return RmsNormFunction<at::BFloat16>::apply(x, weight, eps);
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
