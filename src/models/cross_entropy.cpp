// The fused cross-entropy sum. See cross_entropy.h.
#include "cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <string>

#include "softmax_rows.h"

namespace hyperparallel::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kRowsPerTask = 8;


struct CrossEntropySumFunction : torch::autograd::Function<CrossEntropySumFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits_in, const at::Tensor& labels_in) {
    const at::Tensor logits = logits_in.contiguous(), labels = labels_in.contiguous();
    const int64_t rows = logits.size(0);
    check_label_range(labels, logits.size(1));
    at::Tensor lse = at::empty({rows}, logits.options().dtype(at::kFloat));
    const float* lse_ptr = lse.data_ptr<float>();
    rows_log_sum_exp(logits, lse.data_ptr<float>());
    const int64_t* l = labels.data_ptr<int64_t>();
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) {
      if (l[r] != kIgnoredLabel) sum += static_cast<double>(lse_ptr[r]) - logit_at(logits, r, l[r]);
    }
    ctx->save_for_backward({logits, labels, lse});
    return at::scalar_tensor(sum, lse.options());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &logits = saved[0], &labels = saved[1], &lse = saved[2];
    const float g = grads[0].item<float>();
    const at::Tensor scale = labels.ne(kIgnoredLabel).to(at::kFloat).mul_(g);
    at::Tensor out = at::empty_like(logits);  // the logits' dtype: bf16 rounds the fp32 gradient once
    rows_softmax_minus_one_hot(logits, lse.data_ptr<float>(), labels.data_ptr<int64_t>(), scale.data_ptr<float>(), out);
    return {out, at::Tensor()};
  }
};

}  // namespace

void check_label_range(const at::Tensor& labels, int64_t vocab) {
  const at::Tensor contiguous = labels.contiguous();
  const int64_t* l = contiguous.data_ptr<int64_t>();
  for (int64_t r = 0; r < contiguous.numel(); ++r) {
    if (l[r] != kIgnoredLabel && (l[r] < 0 || l[r] >= vocab)) {
      throw c10::IndexError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                            "Target " + std::to_string(l[r]) + " is out of bounds (vocabulary of " + std::to_string(vocab) + ").");
    }
  }
}

float logit_at(const at::Tensor& logits, int64_t row, int64_t label) {
  const int64_t at = row * logits.size(1) + label;
  return logits.scalar_type() == at::kFloat ? logits.data_ptr<float>()[at] : static_cast<float>(logits.data_ptr<at::BFloat16>()[at]);
}

void rows_log_sum_exp(const at::Tensor& logits, float* lse) {
  const int64_t vocab = logits.size(1);
  const bool fp32 = logits.scalar_type() == at::kFloat;
  at::parallel_for(0, logits.size(0), kRowsPerTask, [&](int64_t begin, int64_t end) {
    if (fp32) {
      log_sum_exp(logits.data_ptr<float>() + begin * vocab, end - begin, vocab, lse + begin);
    } else {
      log_sum_exp_bf16(bf16_bits(logits) + begin * vocab, end - begin, vocab, lse + begin);
    }
  });
}

void rows_softmax_minus_one_hot(const at::Tensor& logits, const float* lse, const int64_t* labels, const float* scale, at::Tensor& out) {
  const int64_t vocab = logits.size(1);
  const bool fp32 = logits.scalar_type() == at::kFloat;
  at::parallel_for(0, logits.size(0), kRowsPerTask, [&](int64_t begin, int64_t end) {
    const int64_t at = begin * vocab, n = end - begin;
    if (fp32) {
      softmax_minus_one_hot(logits.data_ptr<float>() + at, lse + begin, labels + begin, scale + begin, n, vocab, out.data_ptr<float>() + at);
    } else {
      softmax_minus_one_hot_bf16(bf16_bits(logits) + at, lse + begin, labels + begin, scale + begin, n, vocab, bf16_bits(out) + at);
    }
  });
}

at::Tensor cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels) {
  const bool fused_dtype = logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16;
  if (logits.device().is_cpu() && fused_dtype && logits.dim() == 2 && labels.scalar_type() == at::kLong &&
      labels.dim() == 1 && labels.size(0) == logits.size(0)) {
    return CrossEntropySumFunction::apply(logits, labels);
  }
  return at::cross_entropy_loss(logits, labels, {}, at::Reduction::Sum, kIgnoredLabel);
}

}  // namespace hyperparallel::models
