// Forward hooks: an ordered stack of "around" hooks per module, the attachment point for
// parallelisms applied from outside (tensor parallel styles today; CP and checkpointing
// later). Models stay parallelism-free: a module's forward runs through
// run_with_hooks(*this, input, body), and without hooks that is the body and nothing else.
//
// A hook sees the module's (first) tensor input and the continuation `next` — the hooks
// attached after it, then the body — and returns the output:
//   at::Tensor around(const at::Tensor& x, const Forward& next) override {
//     return all_reduce(next(prepare(x)));
//   }
// Hooks run in attachment order, the first attached outermost. They live on the module
// itself, as a parameter-free child "_hp_forward_hooks", so there is no registry outside the
// model and named_parameters() is unchanged. fully_shard's pre/post steps are one entry of
// the same stack (fsdp/module_hooks.h); docs/tp.md "Hook order" says how they compose.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace hyperparallel::nn {

using Forward = std::function<at::Tensor(const at::Tensor&)>;

class ForwardHook {
 public:
  virtual ~ForwardHook() = default;
  virtual at::Tensor around(const at::Tensor& input, const Forward& next) = 0;
};

// Appends `hook` to `module`'s stack (it runs inside the hooks attached before it), or with
// kOutermost puts it first (it sees what the module's caller passes and gets back).
enum class HookPosition { kInnermost, kOutermost };
void add_forward_hook(torch::nn::Module& module, std::shared_ptr<ForwardHook> hook,
                      HookPosition position = HookPosition::kInnermost);
// The stack, outermost first; empty when none is attached.
const std::vector<std::shared_ptr<ForwardHook>>& forward_hooks(torch::nn::Module& module);

// Runs `body` through `module`'s hooks.
at::Tensor run_hook_stack(const std::vector<std::shared_ptr<ForwardHook>>& hooks, const at::Tensor& input,
                          const Forward& body);

template <typename Body>
at::Tensor run_with_hooks(torch::nn::Module& module, const at::Tensor& input, Body&& body) {
  const auto& hooks = forward_hooks(module);
  if (hooks.empty()) return std::forward<Body>(body)(input);
  return run_hook_stack(hooks, input, Forward(std::forward<Body>(body)));
}

}  // namespace hyperparallel::nn
