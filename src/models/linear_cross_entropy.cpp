// The head and the loss in one chunked pass. See linear_cross_entropy.h.
#include "linear_cross_entropy.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <string>
#include <vector>

#include "hyperparallel/platform/user_error.h"
#include "cpu_gemm.h"
#include "cross_entropy.h"

namespace hyperparallel::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LinearCrossEntropyFunction : torch::autograd::Function<LinearCrossEntropyFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden_in, const at::Tensor& weight_in, const at::Tensor& labels_in,
                            int64_t chunk) {
    // bf16 on a CPU without bf16 instructions: the whole loss in fp32 (cpu_gemm.h), the
    // gradients back in bf16 (an fp32 copy of the head weight lives for the call).
    const bool in_fp32 = gemm_through_fp32(hidden_in, weight_in);
    const at::Tensor hidden = in_fp32 ? hidden_in.to(at::kFloat) : hidden_in.contiguous();
    const at::Tensor weight = in_fp32 ? weight_in.to(at::kFloat) : weight_in.contiguous();
    const at::Tensor labels = labels_in.contiguous();
    const int64_t rows = hidden.size(0), vocab = weight.size(0);
    const bool weight_grad = ctx->needs_input_grad(1);
    at::Tensor grad_hidden = at::empty_like(hidden);
    at::Tensor grad_weight = weight_grad ? at::zeros(weight.sizes(), weight.options().dtype(at::kFloat)) : at::Tensor();
    at::Tensor logits_buffer = at::empty({std::min(chunk, rows), vocab}, hidden.options());
    std::vector<float> lse(static_cast<size_t>(std::min(chunk, rows))), scale(lse.size());
    const int64_t* l = labels.data_ptr<int64_t>();
    double sum = 0;
    for (int64_t start = 0; start < rows; start += chunk) {
      const int64_t n = std::min(chunk, rows - start);
      const at::Tensor h = hidden.narrow(0, start, n);
      at::Tensor logits = logits_buffer.narrow(0, 0, n);
      at::mm_out(logits, h, weight.t());
      rows_log_sum_exp(logits, lse.data());
      for (int64_t r = 0; r < n; ++r) {
        const int64_t label = l[start + r];
        scale[static_cast<size_t>(r)] = label == kIgnoredLabel ? 0.0f : 1.0f;
        if (label != kIgnoredLabel) sum += static_cast<double>(lse[static_cast<size_t>(r)]) - logit_at(logits, r, label);
      }
      rows_softmax_minus_one_hot(logits, lse.data(), l + start, scale.data(), logits);  // now d(loss)/d(logits)
      at::Tensor grad_rows = grad_hidden.narrow(0, start, n);
      at::mm_out(grad_rows, logits, weight);
      if (!weight_grad) continue;
      if (logits.scalar_type() == at::kFloat) {
        grad_weight.addmm_(logits.t(), h);
      } else {
        grad_weight.add_(at::mm(logits.t(), h));  // a bf16 GEMM (fp32 inside), summed over chunks in fp32
      }
    }
    ctx->saved_data["grad_hidden"] = grad_hidden;
    ctx->saved_data["grad_weight"] = grad_weight;
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight_in.scalar_type());
    ctx->saved_data["hidden_dtype"] = static_cast<int64_t>(hidden_in.scalar_type());
    return at::scalar_tensor(sum, hidden.options().dtype(at::kFloat));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor g = grads[0];
    at::Tensor grad_hidden = ctx->saved_data["grad_hidden"].toTensor();
    at::Tensor grad_weight = ctx->saved_data["grad_weight"].toTensor();
    const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    const auto hidden_dtype = static_cast<at::ScalarType>(ctx->saved_data["hidden_dtype"].toInt());
    ctx->saved_data.clear();  // the [vocab x hidden] buffer leaves with the returned gradient
    grad_hidden = grad_hidden.mul_(g.to(grad_hidden.scalar_type())).to(hidden_dtype);
    if (grad_weight.defined()) grad_weight = grad_weight.mul_(g).to(weight_dtype);
    return {grad_hidden, grad_weight, at::Tensor(), at::Tensor()};
  }
};

void check_linear_loss_inputs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels, int64_t chunk) {
  const bool dtype = (hidden.scalar_type() == at::kFloat || hidden.scalar_type() == at::kBFloat16) &&
                     weight.scalar_type() == hidden.scalar_type();
  if (!hidden.device().is_cpu() || !weight.device().is_cpu() || !dtype || hidden.dim() != 2 || weight.dim() != 2 ||
      weight.size(1) != hidden.size(1) || labels.scalar_type() != at::kLong || labels.dim() != 1 || labels.size(0) != hidden.size(0) ||
      chunk < 1) {
    throw UserError("linear_cross_entropy_sum: expects CPU hidden [N, H] and weight [V, H] of one dtype (fp32 or bf16), int64 labels [N] "
                    "and a chunk of >= 1 rows");
  }
  check_label_range(labels, weight.size(0));
}

}  // namespace

at::Tensor linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels, int64_t chunk) {
  check_linear_loss_inputs(hidden, weight, labels, chunk);
  return LinearCrossEntropyFunction::apply(hidden, weight, labels, chunk);
}

}  // namespace hyperparallel::models
