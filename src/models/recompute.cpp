// Reentrant activation recompute. See recompute.h.
#include "recompute.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>

namespace hyperparallel::models {
namespace {

thread_local int recompute_depth = 0;  // segments being rerun on this thread (reentrant backward nests)

struct SegmentHolder : torch::CustomClassHolder {
  RecomputedSegment segment;
  at::Tensor rng_state;  // the CPU generator before the forward, replayed by the recompute
  size_t extras = 0;
};

struct RecomputeFunction : torch::autograd::Function<RecomputeFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                                                c10::intrusive_ptr<SegmentHolder> holder) {
    holder->rng_state = at::detail::getDefaultCPUGenerator().get_state();
    std::vector<at::Tensor> extra;
    at::Tensor out;
    {
      at::NoGradGuard no_grad;
      out = holder->segment(input, &extra);
    }
    holder->extras = extra.size();
    ctx->save_for_backward({input});
    ctx->saved_data["segment"] = at::IValue::make_capsule(holder);
    torch::autograd::variable_list outputs{out};
    outputs.insert(outputs.end(), extra.begin(), extra.end());
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<SegmentHolder>(ctx->saved_data["segment"].toCapsule());
    const at::Tensor saved = ctx->get_saved_variables()[0];
    const at::Tensor input = saved.detach().requires_grad_(saved.requires_grad());
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    const at::Tensor rng_after = generator.get_state();
    generator.set_state(holder->rng_state);
    std::vector<at::Tensor> extra;
    at::Tensor out;
    {
      at::AutoGradMode grad_on(true);
      ++recompute_depth;
      try {
        out = holder->segment(input, &extra);
      } catch (...) {
        --recompute_depth;
        throw;
      }
      --recompute_depth;
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
    if (!outputs.empty()) torch::autograd::backward(outputs, output_grads);
    return {input.requires_grad() ? input.grad() : at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool recomputing() { return recompute_depth > 0; }

at::Tensor run_with_recompute(const at::Tensor& input, RecomputedSegment segment, std::vector<at::Tensor>* extra) {
  // Without a gradient into the input the function's backward would never run, and the
  // segment's parameters would get none: run it plainly.
  if (!input.requires_grad() || !at::GradMode::is_enabled()) return segment(input, extra);
  auto holder = c10::make_intrusive<SegmentHolder>();
  holder->segment = std::move(segment);
  torch::autograd::variable_list outputs = RecomputeFunction::apply(input, holder);
  if (extra) extra->insert(extra->end(), outputs.begin() + 1, outputs.end());
  return outputs.front();
}

}  // namespace hyperparallel::models
