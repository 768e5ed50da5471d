// Vectorised softmax row kernels: for the attention tiles (causal_attention.h) the scaled,
// masked softmax of a tile of scores and its backward, each one pass over the tile while it is
// in cache (fp32 or bf16 tiles); for the cross-entropy (cross_entropy.h) each row's log-sum-exp and the gradient
// softmax − one-hot, each one pass over the logits.
//
// LibTorch's softmax runs its exp through Sleef at AVX2 width by default (about 1 ns per
// element here, as long as the tile's GEMM); these use Cephes' single-precision exp polynomial
// (within 2 ulp of expf) on the widest vectors the CPU has: 16 lanes with AVX-512, 8 with
// AVX2 + FMA, 4 otherwise, picked per call from the CPU's flags. Sums and maxima run in those
// lanes and add up once at the end of the row, as ATen's vectorised softmax does; fp32
// throughout. A score 87 or more below its row's maximum gets exactly zero weight, as a
// masked one (the mask's dtype-lowest value) does in the eager core; a NaN makes its row NaN.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace hyperparallel::models {

// A bf16 tensor's elements as the uint16_t bit patterns the bf16 kernels below take.
inline uint16_t* bf16_bits(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

// The vector widths this CPU runs (16 with AVX-512, 8 with AVX2 + FMA, 4 always), widest first.
// `lanes` below picks one of them (tests run each); 0 means the widest.
std::vector<int> softmax_row_widths();

// probs[r, :] = softmax(scores[r, :] * scale + mask[r / rows_per_mask_row, :]) for a
// contiguous [rows, keys] tile; mask rows are `mask_stride` apart. probs may alias scores.
// row_stats (may be null) gets [rows, 2]: each row's maximum and 1 / its sum of exponentials.
void scaled_masked_softmax(const float* scores, int64_t rows, int64_t keys, float scale, const float* mask, int64_t mask_stride,
                           int64_t rows_per_mask_row, float* probs, float* row_stats, int lanes = 0);

// The probabilities scaled_masked_softmax wrote for these scores, bit for bit, from the
// row_stats it kept: one pass, no reductions (the attention backward recomputes them instead
// of keeping them).
void scaled_masked_softmax_from_stats(const float* scores, int64_t rows, int64_t keys, float scale, const float* mask,
                                      int64_t mask_stride, int64_t rows_per_mask_row, const float* row_stats, float* probs,
                                      int lanes = 0);

// grad_scores = probs ∘ (grad_probs − Σ_k probs ∘ grad_probs) · scale per row: the gradient
// of the scores before `scale` (softmax's backward, then the scale's). grad_scores may alias
// grad_probs.
void scaled_softmax_backward(const float* probs, const float* grad_probs, int64_t rows, int64_t keys, float scale, float* grad_scores,
                             int lanes = 0);

// The same two over bf16 tiles (their raw 16 bits; the mask stays fp32): each row widened into
// fp32 in cache, the fp32 row function, the result rounded to bf16 once.
void scaled_masked_softmax_bf16(const uint16_t* scores, int64_t rows, int64_t keys, float scale, const float* mask, int64_t mask_stride,
                                int64_t rows_per_mask_row, uint16_t* probs, float* row_stats, int lanes = 0);
void scaled_masked_softmax_from_stats_bf16(const uint16_t* scores, int64_t rows, int64_t keys, float scale, const float* mask,
                                           int64_t mask_stride, int64_t rows_per_mask_row, const float* row_stats, uint16_t* probs,
                                           int lanes = 0);
void scaled_softmax_backward_bf16(const uint16_t* probs, const uint16_t* grad_probs, int64_t rows, int64_t keys, float scale,
                                  uint16_t* grad_scores, int lanes = 0);

// out[r] = log Σ_j e^{x[r, j]} for a contiguous [rows, d] block.
void log_sum_exp(const float* x, int64_t rows, int64_t d, float* out, int lanes = 0);

// out[r, :] = scale[r] · (e^{x[r, :] − lse[r]} − one_hot(labels[r])); a negative label adds no
// one-hot (scale 0 then zeroes the row).
void softmax_minus_one_hot(const float* x, const float* lse, const int64_t* labels, const float* scale, int64_t rows, int64_t d, float* out,
                           int lanes = 0);

// The same two over bf16 logits (their raw 16 bits), each row widened into fp32 in cache first:
// the fp32 functions of the cast logits, bit for bit; the gradient rounded to bf16 once.
void log_sum_exp_bf16(const uint16_t* x, int64_t rows, int64_t d, float* out, int lanes = 0);
void softmax_minus_one_hot_bf16(const uint16_t* x, const float* lse, const int64_t* labels, const float* scale, int64_t rows, int64_t d,
                                uint16_t* out, int lanes = 0);

}  // namespace hyperparallel::models
