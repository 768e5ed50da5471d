#include "redistribute_function.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "redistribute_local.h"

namespace hyperparallel::dtensor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Carries the call (communicators included) from forward to backward in saved_data.
struct CallHolder : torch::CustomClassHolder {
  explicit CallHolder(RedistributeCall c) : call(std::move(c)) {}
  RedistributeCall call;
};

bool aliases(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.storage().is_alias_of(b.storage());
}

// The product of the sizes of the axes where `placements` is Partial(avg).
int64_t averaged_over(const Placements& placements, const AxisGroups& axes) {
  int64_t n = 1;
  for (size_t i = 0; i < placements.size(); ++i) {
    if (placements[i].is_partial() && placements[i].reduce_op() == comm::ReduceOp::kAvg) n *= axes.size(i);
  }
  return n;
}

struct RedistributeFunction : torch::autograd::Function<RedistributeFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local, c10::intrusive_ptr<CallHolder> holder) {
    const RedistributeCall& call = holder->call;
    at::Tensor out = redistribute_local(local, call.axes, call.global_shape, call.from, call.to);
    // An unchanged input is returned as is (autograd wraps it); a view of it (a slice) must be
    // copied: a custom function's outputs may not be views of its inputs.
    if (!out.is_same(local) && aliases(out, local)) out = out.clone();
    ctx->saved_data["call"] = at::IValue::make_capsule(std::move(holder));
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<CallHolder>(ctx->saved_data["call"].toCapsule());
    const RedistributeCall& call = holder->call;
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    // A Partial(avg) output's local gradient is G/n: read it as the replicated G first, on the
    // axes where the gradient is taken as Replicate.
    at::Tensor grad = grads[0].contiguous();
    const Placements grad_from = call.grad_of_output.value_or(gradient_placements(call.to));
    int64_t output_averaged = 1;
    for (size_t i = 0; i < call.to.size(); ++i) {
      if (call.to[i].is_partial() && call.to[i].reduce_op() == comm::ReduceOp::kAvg && grad_from[i].is_replicate()) {
        output_averaged *= call.axes.size(i);
      }
    }
    if (output_averaged > 1) grad = grad * static_cast<double>(output_averaged);
    grad = redistribute_local(grad, call.axes, call.global_shape, grad_from, gradient_placements(call.from));
    const int64_t input_averaged = averaged_over(call.from, call.axes);
    if (input_averaged > 1) grad = grad / static_cast<double>(input_averaged);
    return {grad, at::Tensor()};
  }
};

}  // namespace

Placements gradient_placements(const Placements& placements) {
  Placements out = placements;
  for (auto& p : out) {
    if (p.is_partial()) p = Replicate();
  }
  return out;
}

at::Tensor redistribute_differentiable(const at::Tensor& local, RedistributeCall call) {
  return RedistributeFunction::apply(local, c10::make_intrusive<CallHolder>(std::move(call)));
}

}  // namespace hyperparallel::dtensor
