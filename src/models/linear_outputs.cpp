// The op-level selective checkpointing policy: Linear outputs kept, the rest recomputed. See linear_outputs.h.
#include "linear_outputs.h"

#include "cpu_gemm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace hyperparallel::models {
namespace {

thread_local LinearOutputScope* open_scope = nullptr;

// y = x Wᵀ + b whose forward hands back y computed earlier; the backward is the linear's.
// `bias` holds the bias or nothing (an undefined tensor cannot be a custom function's input).
struct KeptLinearFunction : torch::autograd::Function<KeptLinearFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                                                at::TensorList bias, const at::Tensor& kept) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["bias"] = !bias.empty();
    return {kept};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const bool with_bias = ctx->saved_data["bias"].toBool();
    const at::Tensor dy = grads[0].reshape({-1, weight.size(0)});
    torch::autograd::variable_list result(with_bias ? 4 : 3);  // x, weight, [bias], kept
    // The products autograd's mm backward forms for x.view(-1, in).mm(weight.t()).
    if (ctx->needs_input_grad(0)) result[0] = gemm(dy, weight).view(x.sizes());
    if (ctx->needs_input_grad(1)) result[1] = gemm(dy.t(), x.reshape({-1, weight.size(1)}));
    if (with_bias && ctx->needs_input_grad(2)) result[2] = dy.sum(0);
    return result;
  }
};

std::vector<int64_t> output_shape(const at::Tensor& x, const at::Tensor& weight) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = weight.size(0);
  return shape;
}

}  // namespace

LinearOutputScope::LinearOutputScope(KeptLinearOutputs& kept_outputs, Mode m) : kept(kept_outputs), mode(m), outer_(open_scope) {
  open_scope = this;
}

LinearOutputScope::~LinearOutputScope() { open_scope = outer_; }

at::Tensor linear_with_kept_outputs(const void* site, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  LinearOutputScope* scope = open_scope;
  if (!scope) return linear(x, weight, bias);
  KeptLinearOutputs& kept = scope->kept;
  if (scope->mode == LinearOutputScope::Mode::kRecord) {
    at::Tensor y = linear(x, weight, bias);
    // An alias of the same memory with no autograd history of its own: y may leave the
    // checkpointed forward as an output (the router's logits) and get the recompute
    // function as its grad_fn, which the recompute's graph must not lead back to.
    kept.outputs.push_back({y.detach(), site});
    return y;
  }
  if (kept.next >= kept.outputs.size()) return linear(x, weight, bias);  // none left: a second recompute
  const size_t k = kept.next++;
  at::Tensor y = std::exchange(kept.outputs[k].output, at::Tensor());
  if (kept.outputs[k].site != site || y.sizes() != at::IntArrayRef(output_shape(x, weight))) {
    // The recompute took another path than the forward: a bug, not a user error.
    throw std::logic_error("selective recompute: linear output " + std::to_string(k) +
                           " kept from the forward was made by another module or has another shape than the recompute's");
  }
  const std::vector<at::Tensor> bias_if_any = bias.defined() ? std::vector<at::Tensor>{bias} : std::vector<at::Tensor>{};
  return KeptLinearFunction::apply(x, weight, at::TensorList(bias_if_any), y)[0];
}

}  // namespace hyperparallel::models
