#include "hyperparallel/nn/forward_hooks.h"

#include <torch/nn/module.h>

namespace hyperparallel::nn {
namespace {

constexpr const char* kHooksChild = "_hp_forward_hooks";

// A parameter-free child module that carries the stack.
class HookStack : public torch::nn::Module {
 public:
  std::vector<std::shared_ptr<ForwardHook>> hooks;
};

HookStack* find_stack(torch::nn::Module& module) {
  for (const auto& child : module.named_children()) {
    if (child.key() == kHooksChild) return dynamic_cast<HookStack*>(child.value().get());
  }
  return nullptr;
}

at::Tensor run_from(const std::vector<std::shared_ptr<ForwardHook>>& hooks, size_t i, const at::Tensor& input,
                    const Forward& body) {
  if (i == hooks.size()) return body(input);
  return hooks[i]->around(input, [&](const at::Tensor& x) { return run_from(hooks, i + 1, x, body); });
}

}  // namespace

void add_forward_hook(torch::nn::Module& module, std::shared_ptr<ForwardHook> hook, HookPosition position) {
  HookStack* stack = find_stack(module);
  if (!stack) stack = module.register_module(kHooksChild, std::make_shared<HookStack>()).get();
  if (position == HookPosition::kOutermost) {
    stack->hooks.insert(stack->hooks.begin(), std::move(hook));
  } else {
    stack->hooks.push_back(std::move(hook));
  }
}

const std::vector<std::shared_ptr<ForwardHook>>& forward_hooks(torch::nn::Module& module) {
  static const std::vector<std::shared_ptr<ForwardHook>> kNone;  // an immutable empty list, not state
  HookStack* stack = find_stack(module);
  return stack ? stack->hooks : kNone;
}

at::Tensor run_hook_stack(const std::vector<std::shared_ptr<ForwardHook>>& hooks, const at::Tensor& input,
                          const Forward& body) {
  return run_from(hooks, 0, input, body);
}

}  // namespace hyperparallel::nn
