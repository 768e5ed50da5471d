// Reentrant activation recompute. See recompute.h.
#include "recompute.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>

#include "activation_swap.h"

namespace hyperparallel::models {
namespace {

thread_local int recompute_depth = 0;  // segments being rerun on this thread (reentrant backward nests)

struct RecomputeScope {
  RecomputeScope() { ++recompute_depth; }
  ~RecomputeScope() { --recompute_depth; }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;
};

struct SegmentHolder : torch::CustomClassHolder {
  RecomputedSegment segment;
  at::Tensor rng_state;  // the CPU generator before the forward, replayed by the recompute
  size_t extras = 0;
  std::shared_ptr<ActivationSwapPool> swap;  // the input waits there (slot), not in the saved tensors
  int64_t slot = -1;
  bool input_requires_grad = false;
  ~SegmentHolder() override {
    if (swap && slot >= 0) swap->discard(slot);  // a graph dropped without its backward
  }
};

struct RecomputeFunction : torch::autograd::Function<RecomputeFunction> {
  // `params`: tensors the segment reads whose gradients leave through this function (see
  // recompute.h); the segment reads them itself, they are inputs only for autograd.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                                                at::TensorList params, c10::intrusive_ptr<SegmentHolder> holder) {
    holder->rng_state = at::detail::getDefaultCPUGenerator().get_state();
    std::vector<at::Tensor> extra;
    at::Tensor out;
    {
      at::NoGradGuard no_grad;
      out = holder->segment(input, &extra);
    }
    holder->extras = extra.size();
    holder->input_requires_grad = input.requires_grad();
    if (holder->swap) holder->slot = holder->swap->stash(input);
    torch::autograd::variable_list saved{holder->swap ? at::Tensor() : input};
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["segment"] = at::IValue::make_capsule(holder);
    torch::autograd::variable_list outputs{out};
    outputs.insert(outputs.end(), extra.begin(), extra.end());
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<SegmentHolder>(ctx->saved_data["segment"].toCapsule());
    const torch::autograd::variable_list saved_vars = ctx->get_saved_variables();
    const at::Tensor saved = holder->swap ? holder->swap->fetch(std::exchange(holder->slot, -1)) : saved_vars[0];
    const at::Tensor input = saved.detach().requires_grad_(holder->input_requires_grad);
    const torch::autograd::variable_list params(saved_vars.begin() + 1, saved_vars.end());
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    const at::Tensor rng_after = generator.get_state();
    generator.set_state(holder->rng_state);
    std::vector<at::Tensor> extra;
    at::Tensor out;
    {
      at::AutoGradMode grad_on(true);
      const RecomputeScope scope;
      out = holder->segment(input, &extra);
    }
    generator.set_state(rng_after);
    // Outputs whose gradient did not arrive (unused) and outputs that need none are left out.
    torch::autograd::variable_list outputs, output_grads;
    for (size_t i = 0; i <= extra.size() && i < grads.size(); ++i) {
      const at::Tensor& o = i == 0 ? out : extra[i - 1];
      if (!grads[i].defined() || !o.requires_grad()) continue;
      outputs.push_back(o);
      output_grads.push_back(grads[i]);
    }
    torch::autograd::variable_list result;
    if (params.empty()) {
      // Reentrant: the segment's parameters accumulate their gradients here.
      if (!outputs.empty()) torch::autograd::backward(outputs, output_grads);
      result.push_back(input.requires_grad() ? input.grad() : at::Tensor());
    } else {
      // The input's and the listed tensors' gradients are returned, not accumulated: autograd
      // sums them with their other uses and accumulates once.
      torch::autograd::variable_list wrt{input};
      wrt.insert(wrt.end(), params.begin(), params.end());
      result = outputs.empty() ? torch::autograd::variable_list(wrt.size())
                               : torch::autograd::grad(outputs, wrt, output_grads, /*retain_graph=*/false,
                                                       /*create_graph=*/false, /*allow_unused=*/true);
    }
    result.emplace_back();  // the holder
    return result;
  }
};

}  // namespace

bool recomputing() { return recompute_depth > 0; }

at::Tensor run_with_recompute(const at::Tensor& input, RecomputedSegment segment, std::vector<at::Tensor>* extra,
                              const std::vector<at::Tensor>& params, std::shared_ptr<ActivationSwapPool> swap) {
  // Without a gradient into the input the function's backward would never run, and the
  // segment's parameters would get none: run it plainly.
  if (!input.requires_grad() || !at::GradMode::is_enabled()) return segment(input, extra);
  auto holder = c10::make_intrusive<SegmentHolder>();
  holder->segment = std::move(segment);
  holder->swap = std::move(swap);
  torch::autograd::variable_list outputs = RecomputeFunction::apply(input, at::TensorList(params), holder);
  if (extra) extra->insert(extra->end(), outputs.begin() + 1, outputs.end());
  return outputs.front();
}

}  // namespace hyperparallel::models
