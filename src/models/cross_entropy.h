// cross_entropy_sum: the language-model loss, Σ over labels ≠ -100 of −log softmax(logits)[label],
// as at::cross_entropy_loss(logits, labels, {}, Sum, -100) computes it, with fp32 CPU logits in
// one fused function:
//  - forward: one read of the logits per row for its log-sum-exp (nothing of [N, V] written;
//    ATen's log_softmax writes its [N, V] output and keeps it for backward);
//  - backward: one pass writing softmax − one-hot scaled by the incoming gradient (ATen writes
//    a one-hot [N, V] gradient first, then log_softmax's backward reads both).
// It keeps the logits and one log-sum-exp per row, the same [N, V] bytes ATen keeps (its
// log-probabilities). The exp is softmax_rows.h's (within 2 ulp of expf); the sum over rows
// runs in double. A label outside [0, V) other than -100 throws, as ATen's does.
// bf16 logits are read as they are, each row widened to fp32 in cache (the cast is exact), so the result is the fp32 function's of the cast logits, bit for bit, without
// the whole [N, V] fp32 copy and its gradient's cast back (bf16 compute: the head's output
// goes straight in, causal_lm.cpp); the gradient is bf16, rounded once. Other dtypes and
// devices take ATen's path.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hyperparallel::models {

// logits [N, V] (fp32 or bf16), labels [N] (int64; -100 ignored); returns a 0-dim fp32 tensor.
at::Tensor cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels);

// The row passes both fused losses share (this one and linear_cross_entropy.h), over contiguous
// CPU [rows, vocab] fp32 or bf16 logits, rows in parallel:
constexpr int64_t kIgnoredLabel = -100;
// c10::IndexError for a label outside [0, vocab) other than kIgnoredLabel, as ATen's loss.
void check_label_range(const at::Tensor& labels, int64_t vocab);
// lse[r] = log Σ_j e^{logits[r, j]}.
void rows_log_sum_exp(const at::Tensor& logits, float* lse);
// out[r, :] = scale[r] · (softmax(logits[r, :]) − one_hot(labels[r])); `out` may be `logits`.
void rows_softmax_minus_one_hot(const at::Tensor& logits, const float* lse, const int64_t* labels, const float* scale, at::Tensor& out);
// logits[r, label], widened to fp32.
float logit_at(const at::Tensor& logits, int64_t row, int64_t label);

}  // namespace hyperparallel::models
