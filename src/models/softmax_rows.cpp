// Vectorised softmax rows for the attention tiles. See softmax_rows.h.
//
// The vectors are GCC's vector extensions, one width per instruction set. The row bodies are
// templates forced inline into three entry points compiled with target("avx512f"),
// target("avx2,fma") and the baseline, so each width is lowered to its own instructions (a
// 16-lane vector compiled for AVX2 is split into scalar code by the generic lowering, 10x
// slower; an "arch=" target would refuse the inlining). The vectors never cross a call, so
// the ABI note GCC prints for 64-byte vector arguments does not apply (-Wpsabi off here).
#include "softmax_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#pragma GCC diagnostic ignored "-Wpsabi"

namespace hyperparallel::models {
namespace {

#define HP_INLINE inline __attribute__((always_inline))

// The vector types per width (GCC ignores vector_size on a typedef that depends on a template
// parameter, hence one specialisation each).
template <int kLanes>
struct VectorTypes;
template <>
struct VectorTypes<16> {
  typedef float Floats __attribute__((vector_size(64)));
  typedef int32_t Ints __attribute__((vector_size(64)));
};
template <>
struct VectorTypes<8> {
  typedef float Floats __attribute__((vector_size(32)));
  typedef int32_t Ints __attribute__((vector_size(32)));
};
template <>
struct VectorTypes<4> {
  typedef float Floats __attribute__((vector_size(16)));
  typedef int32_t Ints __attribute__((vector_size(16)));
};

template <int kLanes>
struct Lanes {
  using Floats = typename VectorTypes<kLanes>::Floats;
  using Ints = typename VectorTypes<kLanes>::Ints;

  static HP_INLINE Floats load(const float* p) {
    Floats v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static HP_INLINE void store(float* p, Floats v) { std::memcpy(p, &v, sizeof v); }
  static HP_INLINE Floats splat(float x) { return Floats{} + x; }
  static HP_INLINE Floats max(Floats a, Floats b) { return a > b ? a : b; }
  static HP_INLINE float max_of(Floats v) {
    float m = v[0];
    for (int l = 1; l < kLanes; ++l) m = std::max(m, v[l]);
    return m;
  }
  static HP_INLINE float sum_of(Floats v) {
    float s = 0;
    for (int l = 0; l < kLanes; ++l) s += v[l];
    return s;
  }
  // e^x for x <= 0 (a score minus its row's maximum): Cephes' expf, 2^n p(r); 0 below -87,
  // NaN for NaN (the clamp keeps it: a comparison with NaN is false).
  static HP_INLINE Floats exp_nonpositive(Floats x) {
    const Floats clamped = x < -87.0f ? splat(-87.0f) : x;
    const Floats fx = clamped * 1.44269504088896341f + 0.5f;
    Ints n = __builtin_convertvector(fx, Ints);      // rounds toward zero ...
    n += (__builtin_convertvector(n, Floats) > fx);  // ... minus one where that rounded up: floor
    const Floats nf = __builtin_convertvector(n, Floats);
    const Floats r = clamped - nf * 0.693359375f + nf * 2.12194440e-4f;
    Floats p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const Ints bits = (n + 127) << 23;
    Floats two_n;
    std::memcpy(&two_n, &bits, sizeof two_n);
    return x < -87.0f ? Floats{} : p * two_n;
  }
  // The row's tail (fewer than kLanes entries) through one vector padded with `pad`.
  static HP_INLINE Floats load_tail(const float* p, int64_t n, float pad) {
    float buffer[kLanes];
    for (int l = 0; l < kLanes; ++l) buffer[l] = l < n ? p[l] : pad;
    return load(buffer);
  }
  static HP_INLINE void store_tail(float* p, int64_t n, Floats v) {
    for (int64_t l = 0; l < n; ++l) p[l] = v[l];
  }
};

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

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HP_X86_WIDTHS 1
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

int widest(int lanes) {
  if (lanes) return lanes;
#ifdef HP_X86_WIDTHS
  if (__builtin_cpu_supports("avx512f")) return 16;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 8;
#endif
  return 4;
}

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

}  // namespace hyperparallel::models
