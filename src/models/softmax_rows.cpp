// Vectorised softmax rows for the attention tiles. See softmax_rows.h.
//
// The vectors are vector_lanes.h's, one width per instruction set: the row bodies are
// templates forced inline into three entry points compiled with target("avx512f"),
// target("avx2,fma") and the baseline (why, in vector_lanes.h).
#include "softmax_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "vector_lanes.h"

namespace hyperparallel::models {
namespace {

using vector_lanes::Lanes;

template <int kLanes>
HP_INLINE void softmax_row(const float* s, const float* m, int64_t d, float scale, float* p) {
  using L = Lanes<kLanes>;
  using Floats = typename L::Floats;
  const int64_t body = d - d % kLanes, tail = d - body;
  Floats top = L::splat(-INFINITY);
  for (int64_t j = 0; j < body; j += kLanes) {
    const Floats x = L::load(s + j) * scale + L::load(m + j);
    L::store(p + j, x);
    top = L::max(top, x);
  }
  Floats x_tail{};
  if (tail) {
    x_tail = L::load_tail(s + body, tail, 0.0f) * scale + L::load_tail(m + body, tail, -INFINITY);
    top = L::max(top, x_tail);
  }
  const float row_max = L::max_of(top);
  Floats sum{};
  for (int64_t j = 0; j < body; j += kLanes) {
    const Floats e = L::exp_nonpositive(L::load(p + j) - row_max);
    L::store(p + j, e);
    sum += e;
  }
  Floats e_tail{};
  if (tail) {
    e_tail = L::exp_nonpositive(x_tail - row_max);  // the padding is -inf: zero weight
    sum += e_tail;
  }
  const float inverse = 1.0f / L::sum_of(sum);
  for (int64_t j = 0; j < body; j += kLanes) L::store(p + j, L::load(p + j) * inverse);
  if (tail) L::store_tail(p + body, tail, e_tail * inverse);
}

template <int kLanes>
HP_INLINE void softmax_backward_row(const float* p, const float* dp, int64_t d, float scale, float* ds) {
  using L = Lanes<kLanes>;
  using Floats = typename L::Floats;
  const int64_t body = d - d % kLanes, tail = d - body;
  Floats dot{};
  for (int64_t j = 0; j < body; j += kLanes) dot += L::load(p + j) * L::load(dp + j);
  Floats p_tail{}, dp_tail{};
  if (tail) {
    p_tail = L::load_tail(p + body, tail, 0.0f);
    dp_tail = L::load_tail(dp + body, tail, 0.0f);
    dot += p_tail * dp_tail;
  }
  const float row_dot = L::sum_of(dot);
  for (int64_t j = 0; j < body; j += kLanes) L::store(ds + j, L::load(p + j) * (L::load(dp + j) - row_dot) * scale);
  if (tail) L::store_tail(ds + body, tail, p_tail * (dp_tail - row_dot) * scale);
}

template <int kLanes>
HP_INLINE void softmax_rows(const float* scores, int64_t rows, int64_t keys, float scale, const float* mask, int64_t mask_stride,
                            int64_t rows_per_mask_row, float* probs) {
  for (int64_t r = 0; r < rows; ++r) {
    softmax_row<kLanes>(scores + r * keys, mask + (r / rows_per_mask_row) * mask_stride, keys, scale, probs + r * keys);
  }
}

template <int kLanes>
HP_INLINE void softmax_backward_rows(const float* probs, const float* grad_probs, int64_t rows, int64_t keys, float scale, float* out) {
  for (int64_t r = 0; r < rows; ++r) softmax_backward_row<kLanes>(probs + r * keys, grad_probs + r * keys, keys, scale, out + r * keys);
}

// log Σ_j e^{x_j} of each row: its maximum plus the log of the shifted sum.
template <int kLanes>
HP_INLINE void log_sum_exp_rows(const float* x, int64_t rows, int64_t d, float* out) {
  using L = Lanes<kLanes>;
  using Floats = typename L::Floats;
  const int64_t body = d - d % kLanes, tail = d - body;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * d;
    Floats top = L::splat(-INFINITY);
    for (int64_t j = 0; j < body; j += kLanes) top = L::max(top, L::load(row + j));
    const Floats x_tail = tail ? L::load_tail(row + body, tail, -INFINITY) : L::splat(-INFINITY);
    const float row_max = L::max_of(L::max(top, x_tail));
    Floats sum{};
    for (int64_t j = 0; j < body; j += kLanes) sum += L::exp_nonpositive(L::load(row + j) - row_max);
    if (tail) sum += L::exp_nonpositive(x_tail - row_max);
    out[r] = row_max + std::log(L::sum_of(sum));
  }
}

// out[r, j] = scale_r · (e^{x_rj − lse_r} − [j = label_r]): the cross-entropy's gradient.
template <int kLanes>
HP_INLINE void softmax_minus_one_hot_rows(const float* x, const float* lse, const int64_t* labels, const float* scale, int64_t rows,
                                          int64_t d, float* out) {
  using L = Lanes<kLanes>;
  const int64_t body = d - d % kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * d;
    float* o = out + r * d;
    const float shift = lse[r], g = scale[r];
    for (int64_t j = 0; j < body; j += kLanes) L::store(o + j, L::exp_nonpositive(L::load(row + j) - shift) * g);
    if (body < d) L::store_tail(o + body, d - body, L::exp_nonpositive(L::load_tail(row + body, d - body, 0.0f) - shift) * g);
    if (labels[r] >= 0) o[labels[r]] -= g;
  }
}

// bf16 logits: each row widened into an fp32 scratch row (in cache), then the fp32 row
// kernels, then (backward) rounded once: the fp32 path's bits for the cast logits.
template <int kLanes>
HP_INLINE void log_sum_exp_rows_bf16(const uint16_t* x, int64_t rows, int64_t d, float* out, float* scratch) {
  for (int64_t r = 0; r < rows; ++r) {
    Lanes<kLanes>::widen_row(x + r * d, d, scratch);
    log_sum_exp_rows<kLanes>(scratch, 1, d, out + r);
  }
}

template <int kLanes>
HP_INLINE void softmax_minus_one_hot_rows_bf16(const uint16_t* x, const float* lse, const int64_t* labels, const float* scale,
                                               int64_t rows, int64_t d, uint16_t* out, float* scratch) {
  for (int64_t r = 0; r < rows; ++r) {
    Lanes<kLanes>::widen_row(x + r * d, d, scratch);
    softmax_minus_one_hot_rows<kLanes>(scratch, lse + r, labels + r, scale + r, 1, d, scratch);
    Lanes<kLanes>::round_row(scratch, d, out + r * d);
  }
}

#ifdef HP_X86_WIDTHS
__attribute__((target("avx512f"))) void log_sum_exp_bf16_avx512(const uint16_t* x, int64_t rows, int64_t d, float* out, float* scratch) {
  log_sum_exp_rows_bf16<16>(x, rows, d, out, scratch);
}
__attribute__((target("avx2,fma"))) void log_sum_exp_bf16_avx2(const uint16_t* x, int64_t rows, int64_t d, float* out, float* scratch) {
  log_sum_exp_rows_bf16<8>(x, rows, d, out, scratch);
}
__attribute__((target("avx512f"))) void one_hot_bf16_avx512(const uint16_t* x, const float* lse, const int64_t* labels, const float* scale,
                                                            int64_t rows, int64_t d, uint16_t* out, float* scratch) {
  softmax_minus_one_hot_rows_bf16<16>(x, lse, labels, scale, rows, d, out, scratch);
}
__attribute__((target("avx2,fma"))) void one_hot_bf16_avx2(const uint16_t* x, const float* lse, const int64_t* labels, const float* scale,
                                                          int64_t rows, int64_t d, uint16_t* out, float* scratch) {
  softmax_minus_one_hot_rows_bf16<8>(x, lse, labels, scale, rows, d, out, scratch);
}
__attribute__((target("avx512f"))) void softmax_rows_avx512(const float* s, int64_t rows, int64_t keys, float scale, const float* m,
                                                            int64_t stride, int64_t per, float* p) {
  softmax_rows<16>(s, rows, keys, scale, m, stride, per, p);
}
__attribute__((target("avx2,fma"))) void softmax_rows_avx2(const float* s, int64_t rows, int64_t keys, float scale, const float* m,
                                                          int64_t stride, int64_t per, float* p) {
  softmax_rows<8>(s, rows, keys, scale, m, stride, per, p);
}
__attribute__((target("avx512f"))) void backward_rows_avx512(const float* p, const float* dp, int64_t rows, int64_t keys, float scale,
                                                             float* ds) {
  softmax_backward_rows<16>(p, dp, rows, keys, scale, ds);
}
__attribute__((target("avx2,fma"))) void backward_rows_avx2(const float* p, const float* dp, int64_t rows, int64_t keys, float scale,
                                                           float* ds) {
  softmax_backward_rows<8>(p, dp, rows, keys, scale, ds);
}
__attribute__((target("avx512f"))) void log_sum_exp_rows_avx512(const float* x, int64_t rows, int64_t d, float* out) {
  log_sum_exp_rows<16>(x, rows, d, out);
}
__attribute__((target("avx2,fma"))) void log_sum_exp_rows_avx2(const float* x, int64_t rows, int64_t d, float* out) {
  log_sum_exp_rows<8>(x, rows, d, out);
}
__attribute__((target("avx512f"))) void one_hot_rows_avx512(const float* x, const float* lse, const int64_t* labels, const float* scale,
                                                            int64_t rows, int64_t d, float* out) {
  softmax_minus_one_hot_rows<16>(x, lse, labels, scale, rows, d, out);
}
__attribute__((target("avx2,fma"))) void one_hot_rows_avx2(const float* x, const float* lse, const int64_t* labels, const float* scale,
                                                          int64_t rows, int64_t d, float* out) {
  softmax_minus_one_hot_rows<8>(x, lse, labels, scale, rows, d, out);
}
#endif

int widest(int lanes) { return vector_lanes::widest_lanes(lanes); }

}  // namespace

std::vector<int> softmax_row_widths() {
  std::vector<int> widths;
  for (int lanes = widest(0); lanes >= 4; lanes /= 2) widths.push_back(lanes);
  return widths;
}

void scaled_masked_softmax(const float* scores, int64_t rows, int64_t keys, float scale, const float* mask, int64_t mask_stride,
                           int64_t rows_per_mask_row, float* probs, int lanes) {
  switch (widest(lanes)) {
#ifdef HP_X86_WIDTHS
    case 16:
      return softmax_rows_avx512(scores, rows, keys, scale, mask, mask_stride, rows_per_mask_row, probs);
    case 8:
      return softmax_rows_avx2(scores, rows, keys, scale, mask, mask_stride, rows_per_mask_row, probs);
#endif
    default:
      return softmax_rows<4>(scores, rows, keys, scale, mask, mask_stride, rows_per_mask_row, probs);
  }
}

void scaled_softmax_backward(const float* probs, const float* grad_probs, int64_t rows, int64_t keys, float scale, float* grad_scores,
                             int lanes) {
  switch (widest(lanes)) {
#ifdef HP_X86_WIDTHS
    case 16:
      return backward_rows_avx512(probs, grad_probs, rows, keys, scale, grad_scores);
    case 8:
      return backward_rows_avx2(probs, grad_probs, rows, keys, scale, grad_scores);
#endif
    default:
      return softmax_backward_rows<4>(probs, grad_probs, rows, keys, scale, grad_scores);
  }
}

void log_sum_exp(const float* x, int64_t rows, int64_t d, float* out, int lanes) {
  switch (widest(lanes)) {
#ifdef HP_X86_WIDTHS
    case 16:
      return log_sum_exp_rows_avx512(x, rows, d, out);
    case 8:
      return log_sum_exp_rows_avx2(x, rows, d, out);
#endif
    default:
      return log_sum_exp_rows<4>(x, rows, d, out);
  }
}

void softmax_minus_one_hot(const float* x, const float* lse, const int64_t* labels, const float* scale, int64_t rows, int64_t d, float* out,
                           int lanes) {
  switch (widest(lanes)) {
#ifdef HP_X86_WIDTHS
    case 16:
      return one_hot_rows_avx512(x, lse, labels, scale, rows, d, out);
    case 8:
      return one_hot_rows_avx2(x, lse, labels, scale, rows, d, out);
#endif
    default:
      return softmax_minus_one_hot_rows<4>(x, lse, labels, scale, rows, d, out);
  }
}

void log_sum_exp_bf16(const uint16_t* x, int64_t rows, int64_t d, float* out, int lanes) {
  std::vector<float> scratch(static_cast<size_t>(d));
  switch (widest(lanes)) {
#ifdef HP_X86_WIDTHS
    case 16:
      return log_sum_exp_bf16_avx512(x, rows, d, out, scratch.data());
    case 8:
      return log_sum_exp_bf16_avx2(x, rows, d, out, scratch.data());
#endif
    default:
      return log_sum_exp_rows_bf16<4>(x, rows, d, out, scratch.data());
  }
}

void softmax_minus_one_hot_bf16(const uint16_t* x, const float* lse, const int64_t* labels, const float* scale, int64_t rows, int64_t d,
                                uint16_t* out, int lanes) {
  std::vector<float> scratch(static_cast<size_t>(d));
  switch (widest(lanes)) {
#ifdef HP_X86_WIDTHS
    case 16:
      return one_hot_bf16_avx512(x, lse, labels, scale, rows, d, out, scratch.data());
    case 8:
      return one_hot_bf16_avx2(x, lse, labels, scale, rows, d, out, scratch.data());
#endif
    default:
      return softmax_minus_one_hot_rows_bf16<4>(x, lse, labels, scale, rows, d, out, scratch.data());
  }
}

}  // namespace hyperparallel::models
