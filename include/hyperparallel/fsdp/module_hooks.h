// The forward hook point that LibTorch's torch::nn::Module lacks.
//
// fully_shard (and later TP/CP plans) must run code right before and right after a module's
// forward. A module opts in with one step: its forward() wraps its body in hooked_forward:
//
//   torch::Tensor forward(torch::Tensor x) {
//     return hyperparallel::fsdp::hooked_forward(*this, [&] { return fc2(fc1(x).relu()); });
//   }
//
// Without hooks attached this calls the body and nothing else. Hooks live on the module
// itself, as a child module named "_hp_hooks" that holds no parameters — so there is no
// registry outside the model, and named_parameters() is unchanged.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <utility>

namespace torch::nn {
class Module;
}

namespace hyperparallel::fsdp {

class ModuleHooks {
 public:
  virtual ~ModuleHooks() = default;
  virtual void pre_forward() = 0;
  // Gets a forward input (after pre_forward); returns what the body should see (e.g. cast
  // to the compute dtype).
  virtual at::Tensor cast_input(at::Tensor input) { return input; }
  // Gets the forward's output; returns it (possibly with autograd hooks registered on it).
  virtual at::Tensor post_forward(at::Tensor output) = 0;
};

// Attaches `hooks` to `module`; throws UserError if it already has hooks.
void attach_hooks(torch::nn::Module& module, std::shared_ptr<ModuleHooks> hooks);
// The hooks attached to `module`, or nullptr.
ModuleHooks* find_hooks(torch::nn::Module& module);

template <typename Body>
at::Tensor hooked_forward(torch::nn::Module& module, Body&& body) {
  ModuleHooks* hooks = find_hooks(module);
  if (!hooks) return std::forward<Body>(body)();
  hooks->pre_forward();
  return hooks->post_forward(std::forward<Body>(body)());
}

// The same with the forward's input passed through the hooks (mixed precision casts it):
//   return hooked_forward(*this, x, [&](const at::Tensor& x) { return fc2(fc1(x).relu()); });
template <typename Body>
at::Tensor hooked_forward(torch::nn::Module& module, const at::Tensor& input, Body&& body) {
  ModuleHooks* hooks = find_hooks(module);
  if (!hooks) return std::forward<Body>(body)(input);
  hooks->pre_forward();
  return hooks->post_forward(std::forward<Body>(body)(hooks->cast_input(input)));
}

}  // namespace hyperparallel::fsdp
