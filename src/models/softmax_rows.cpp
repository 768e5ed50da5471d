// Vectorised softmax rows for the attention tiles. See softmax_rows.h.
//
// The vectors are vector_lanes.h's, one width per instruction set: each kernel's rows are a
// functor that vector_lanes::run_widest inlines into the entry point of the CPU's widest
// vectors (why, in vector_lanes.h).
#include "softmax_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "vector_lanes.h"

namespace hyperparallel::models {
namespace {

using vector_lanes::Lanes;

// stats (may be null) gets the row's maximum and 1 / Σ e^{x - max}: what
// softmax_row_from_stats needs to write the same probabilities again.
template <int kLanes>
HP_INLINE void softmax_row(const float* s, const float* m, int64_t d, float scale, float* p, float* stats) {
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
  if (stats) {
    stats[0] = row_max;
    stats[1] = inverse;
  }
}

// softmax_row's probabilities from its stats: the same operations on the same values, so
// the same bits.
template <int kLanes>
HP_INLINE void softmax_row_from_stats(const float* s, const float* m, int64_t d, float scale, const float* stats, float* p) {
  using L = Lanes<kLanes>;
  const int64_t body = d - d % kLanes, tail = d - body;
  const float row_max = stats[0], inverse = stats[1];
  for (int64_t j = 0; j < body; j += kLanes) {
    const typename L::Floats x = L::load(s + j) * scale + L::load(m + j);
    L::store(p + j, L::exp_nonpositive(x - row_max) * inverse);
  }
  if (tail) {
    const typename L::Floats x = L::load_tail(s + body, tail, 0.0f) * scale + L::load_tail(m + body, tail, -INFINITY);
    L::store_tail(p + body, tail, L::exp_nonpositive(x - row_max) * inverse);
  }
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

// Rows of fp32 (T = float) or bf16 (T = uint16_t) tiles and logits: a bf16 row is widened into
// an fp32 scratch row in cache, goes through the fp32 row kernel, and its result is rounded
// once, so it gets the fp32 path's bits for the cast values.
template <int kLanes>
HP_INLINE const float* widened(const float* row, int64_t, float*) {
  return row;
}
template <int kLanes>
HP_INLINE const float* widened(const uint16_t* row, int64_t d, float* scratch) {
  Lanes<kLanes>::widen_row(row, d, scratch);
  return scratch;
}
// Where a row's fp32 result goes: an fp32 output row itself, a bf16 one's scratch row ...
HP_INLINE float* fp32_result(float* out, float*) { return out; }
HP_INLINE float* fp32_result(uint16_t*, float* scratch) { return scratch; }
// ... and how it is stored: already in place, or rounded into the bf16 row.
template <int kLanes>
HP_INLINE void store_result(const float*, int64_t, float*) {}
template <int kLanes>
HP_INLINE void store_result(const float* result, int64_t d, uint16_t* out) {
  Lanes<kLanes>::round_row(result, d, out);
}

// The row kernels as functors for vector_lanes::run_widest: run<kLanes>() walks the rows.
// SoftmaxRows writes each row's stats when `stats` is given; with `from_stats` it reads them
// instead (softmax_row_from_stats).
template <typename T>
struct SoftmaxRows {
  const T* scores;
  int64_t rows, keys;
  float scale;
  const float* mask;
  int64_t mask_stride, rows_per_mask_row;
  T* probs;
  float* stats;
  bool from_stats;
  float* scratch;  // keys floats, for bf16
  template <int kLanes>
  HP_INLINE void run() const {
    for (int64_t r = 0; r < rows; ++r) {
      float* result = fp32_result(probs + r * keys, scratch);
      const float* s = widened<kLanes>(scores + r * keys, keys, scratch);
      const float* m = mask + (r / rows_per_mask_row) * mask_stride;
      if (from_stats) {
        softmax_row_from_stats<kLanes>(s, m, keys, scale, stats + 2 * r, result);
      } else {
        softmax_row<kLanes>(s, m, keys, scale, result, stats ? stats + 2 * r : nullptr);
      }
      store_result<kLanes>(result, keys, probs + r * keys);
    }
  }
};

template <typename T>
struct SoftmaxBackwardRows {
  const T *probs, *grad_probs;
  int64_t rows, keys;
  float scale;
  T* grad_scores;
  float* scratch;  // 2 x keys floats, for bf16
  template <int kLanes>
  HP_INLINE void run() const {
    for (int64_t r = 0; r < rows; ++r) {
      const float* p = widened<kLanes>(probs + r * keys, keys, scratch);
      const float* dp = widened<kLanes>(grad_probs + r * keys, keys, scratch + keys);
      float* result = fp32_result(grad_scores + r * keys, scratch + keys);
      softmax_backward_row<kLanes>(p, dp, keys, scale, result);
      store_result<kLanes>(result, keys, grad_scores + r * keys);
    }
  }
};

// log Σ_j e^{x_j} of each row: its maximum plus the log of the shifted sum.
template <int kLanes>
HP_INLINE float log_sum_exp_row(const float* row, int64_t d) {
  using L = Lanes<kLanes>;
  using Floats = typename L::Floats;
  const int64_t body = d - d % kLanes, tail = d - body;
  Floats top = L::splat(-INFINITY);
  for (int64_t j = 0; j < body; j += kLanes) top = L::max(top, L::load(row + j));
  const Floats x_tail = tail ? L::load_tail(row + body, tail, -INFINITY) : L::splat(-INFINITY);
  const float row_max = L::max_of(L::max(top, x_tail));
  Floats sum{};
  for (int64_t j = 0; j < body; j += kLanes) sum += L::exp_nonpositive(L::load(row + j) - row_max);
  if (tail) sum += L::exp_nonpositive(x_tail - row_max);
  return row_max + std::log(L::sum_of(sum));
}

// o[j] = g · (e^{x_j − shift} − [j = label]): one row of the cross-entropy's gradient.
template <int kLanes>
HP_INLINE void softmax_minus_one_hot_row(const float* row, float shift, int64_t label, float g, int64_t d, float* o) {
  using L = Lanes<kLanes>;
  const int64_t body = d - d % kLanes;
  for (int64_t j = 0; j < body; j += kLanes) L::store(o + j, L::exp_nonpositive(L::load(row + j) - shift) * g);
  if (body < d) L::store_tail(o + body, d - body, L::exp_nonpositive(L::load_tail(row + body, d - body, 0.0f) - shift) * g);
  if (label >= 0) o[label] -= g;
}

template <typename T>
struct LogSumExpRows {
  const T* x;
  int64_t rows, d;
  float* out;
  float* scratch;  // d floats, for bf16
  template <int kLanes>
  HP_INLINE void run() const {
    for (int64_t r = 0; r < rows; ++r) out[r] = log_sum_exp_row<kLanes>(widened<kLanes>(x + r * d, d, scratch), d);
  }
};

template <typename T>
struct SoftmaxMinusOneHotRows {
  const T* x;
  const float* lse;
  const int64_t* labels;
  const float* scale;
  int64_t rows, d;
  T* out;
  float* scratch;  // d floats, for bf16
  template <int kLanes>
  HP_INLINE void run() const {
    for (int64_t r = 0; r < rows; ++r) {
      float* result = fp32_result(out + r * d, scratch);
      softmax_minus_one_hot_row<kLanes>(widened<kLanes>(x + r * d, d, scratch), lse[r], labels[r], scale[r], d, result);
      store_result<kLanes>(result, d, out + r * d);
    }
  }
};

}  // namespace

std::vector<int> softmax_row_widths() {
  std::vector<int> widths;
  for (int lanes = vector_lanes::widest_lanes(0); lanes >= 4; lanes /= 2) widths.push_back(lanes);
  return widths;
}

void scaled_masked_softmax(const float* scores, int64_t rows, int64_t keys, float scale, const float* mask, int64_t mask_stride,
                           int64_t rows_per_mask_row, float* probs, float* row_stats, int lanes) {
  vector_lanes::run_widest(
      lanes, SoftmaxRows<float>{scores, rows, keys, scale, mask, mask_stride, rows_per_mask_row, probs, row_stats, false, nullptr});
}

void scaled_masked_softmax_from_stats(const float* scores, int64_t rows, int64_t keys, float scale, const float* mask,
                                      int64_t mask_stride, int64_t rows_per_mask_row, const float* row_stats, float* probs, int lanes) {
  vector_lanes::run_widest(lanes, SoftmaxRows<float>{scores, rows, keys, scale, mask, mask_stride, rows_per_mask_row, probs,
                                                     const_cast<float*>(row_stats), true, nullptr});
}

void scaled_softmax_backward(const float* probs, const float* grad_probs, int64_t rows, int64_t keys, float scale, float* grad_scores,
                             int lanes) {
  vector_lanes::run_widest(lanes, SoftmaxBackwardRows<float>{probs, grad_probs, rows, keys, scale, grad_scores, nullptr});
}

void scaled_masked_softmax_bf16(const uint16_t* scores, int64_t rows, int64_t keys, float scale, const float* mask, int64_t mask_stride,
                                int64_t rows_per_mask_row, uint16_t* probs, float* row_stats, int lanes) {
  std::vector<float> scratch(static_cast<size_t>(keys));
  vector_lanes::run_widest(lanes, SoftmaxRows<uint16_t>{scores, rows, keys, scale, mask, mask_stride, rows_per_mask_row, probs,
                                                        row_stats, false, scratch.data()});
}

void scaled_masked_softmax_from_stats_bf16(const uint16_t* scores, int64_t rows, int64_t keys, float scale, const float* mask,
                                           int64_t mask_stride, int64_t rows_per_mask_row, const float* row_stats, uint16_t* probs,
                                           int lanes) {
  std::vector<float> scratch(static_cast<size_t>(keys));
  vector_lanes::run_widest(lanes, SoftmaxRows<uint16_t>{scores, rows, keys, scale, mask, mask_stride, rows_per_mask_row, probs,
                                                        const_cast<float*>(row_stats), true, scratch.data()});
}

void scaled_softmax_backward_bf16(const uint16_t* probs, const uint16_t* grad_probs, int64_t rows, int64_t keys, float scale,
                                  uint16_t* grad_scores, int lanes) {
  std::vector<float> scratch(static_cast<size_t>(2 * keys));
  vector_lanes::run_widest(lanes, SoftmaxBackwardRows<uint16_t>{probs, grad_probs, rows, keys, scale, grad_scores, scratch.data()});
}

void log_sum_exp(const float* x, int64_t rows, int64_t d, float* out, int lanes) {
  vector_lanes::run_widest(lanes, LogSumExpRows<float>{x, rows, d, out, nullptr});
}

void softmax_minus_one_hot(const float* x, const float* lse, const int64_t* labels, const float* scale, int64_t rows, int64_t d, float* out,
                           int lanes) {
  vector_lanes::run_widest(lanes, SoftmaxMinusOneHotRows<float>{x, lse, labels, scale, rows, d, out, nullptr});
}

void log_sum_exp_bf16(const uint16_t* x, int64_t rows, int64_t d, float* out, int lanes) {
  std::vector<float> scratch(static_cast<size_t>(d));
  vector_lanes::run_widest(lanes, LogSumExpRows<uint16_t>{x, rows, d, out, scratch.data()});
}

void softmax_minus_one_hot_bf16(const uint16_t* x, const float* lse, const int64_t* labels, const float* scale, int64_t rows, int64_t d,
                                uint16_t* out, int lanes) {
  std::vector<float> scratch(static_cast<size_t>(d));
  vector_lanes::run_widest(lanes, SoftmaxMinusOneHotRows<uint16_t>{x, lse, labels, scale, rows, d, out, scratch.data()});
}

}  // namespace hyperparallel::models
