// Rotary embedding kernels. See fused_rope.h.
#include "fused_rope.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

namespace hyperparallel::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Geometry {
  int64_t batch, seq, heads, dim, kv_heads, groups;
  int64_t x_batch_stride, x_seq_stride;  // of the [B, T, H, D] side
};

// Visits every (b, t, h) row: `x_row` on the [B, T, H, D] side, `y_row` on the
// [B, KV, T, G, D] side, and the cos/sin rows of (b, t).
template <typename Fn>
void for_each_row(const Geometry& g, Fn&& fn) {
  at::parallel_for(0, g.batch * g.seq, 8, [&](int64_t begin, int64_t end) {
    for (int64_t bt = begin; bt < end; ++bt) {
      const int64_t b = bt / g.seq, t = bt % g.seq;
      for (int64_t h = 0; h < g.heads; ++h) {
        const int64_t kv = h / g.groups, grp = h % g.groups;
        const int64_t x_off = b * g.x_batch_stride + t * g.x_seq_stride + h * g.dim;
        const int64_t y_off = (((b * g.kv_heads + kv) * g.seq + t) * g.groups + grp) * g.dim;
        fn(x_off, y_off, bt * g.dim);
      }
    }
  });
}

struct RopeFunction : torch::autograd::Function<RopeFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            int64_t kv_heads) {
    Geometry g{x.size(0), x.size(1), x.size(2), x.size(3), kv_heads, x.size(2) / kv_heads, x.stride(0), x.stride(1)};
    const at::Tensor c = cos.contiguous(), s = sin.contiguous();
    at::Tensor y = at::empty({g.batch, g.kv_heads, g.seq, g.groups, g.dim}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* cp = c.data_ptr<float>();
    const float* sp = s.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int64_t half = g.dim / 2;
    for_each_row(g, [&](int64_t xo, int64_t yo, int64_t co) {
      const float* xr = xp + xo;
      const float* cr = cp + co;
      const float* sr = sp + co;
      float* yr = yp + yo;
      for (int64_t d = 0; d < half; ++d) {
        yr[d] = xr[d] * cr[d] + (-xr[d + half]) * sr[d];
        yr[d + half] = xr[d + half] * cr[d + half] + xr[d] * sr[d + half];
      }
    });
    ctx->save_for_backward({c, s});
    ctx->saved_data["geometry"] = std::vector<int64_t>{g.batch, g.seq, g.heads, g.dim, g.kv_heads};
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto geo = ctx->saved_data["geometry"].toIntVector();
    Geometry g{geo[0], geo[1], geo[2], geo[3], geo[4], geo[2] / geo[4], geo[1] * geo[2] * geo[3], geo[2] * geo[3]};
    const at::Tensor gy = grads[0].contiguous();
    at::Tensor gx = at::empty({g.batch, g.seq, g.heads, g.dim}, gy.options());
    const float* gyp = gy.data_ptr<float>();
    const float* cp = saved[0].data_ptr<float>();
    const float* sp = saved[1].data_ptr<float>();
    float* gxp = gx.data_ptr<float>();
    const int64_t half = g.dim / 2;
    for_each_row(g, [&](int64_t xo, int64_t yo, int64_t co) {
      const float* gr = gyp + yo;
      const float* cr = cp + co;
      const float* sr = sp + co;
      float* xr = gxp + xo;
      for (int64_t d = 0; d < half; ++d) {
        xr[d] = gr[d] * cr[d] + gr[d + half] * sr[d + half];
        xr[d + half] = gr[d + half] * cr[d + half] - gr[d] * sr[d];
      }
    });
    return {gx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t kv_heads) {
  TORCH_CHECK(x.dim() == 4 && x.scalar_type() == at::kFloat && x.stride(3) == 1 && x.stride(2) == x.size(3),
              "fused_rope: x must be fp32 [B, T, H, D] with contiguous heads");
  TORCH_CHECK(x.size(2) % kv_heads == 0, "fused_rope: heads must be a multiple of kv_heads");
  return RopeFunction::apply(x, cos.to(at::kFloat), sin.to(at::kFloat), kv_heads);
}

}  // namespace hyperparallel::models
