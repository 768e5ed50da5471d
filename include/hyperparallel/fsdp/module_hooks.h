// fully_shard's hook point on a module: one entry of the module's forward-hook stack
// (nn/forward_hooks.h), so FSDP, tensor-parallel styles and later CP and checkpointing stack
// on the same list, in attachment order (docs/tp.md "Hook order").
//
// A module opts in with one step: its forward() wraps its body in hooked_forward:
//
//   torch::Tensor forward(torch::Tensor x) {
//     return hyperparallel::fsdp::hooked_forward(*this, [&] { return fc2(fc1(x).relu()); });
//   }
//
// Without hooks attached this calls the body and nothing else. The stack lives on the module
// itself (a parameter-free child), so there is no registry outside the model and
// named_parameters() is unchanged.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <utility>

#include "hyperparallel/nn/forward_hooks.h"

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

// Appends `hooks` to `module`'s forward-hook stack; throws UserError if fully_shard's hooks are
// already there.
void attach_hooks(torch::nn::Module& module, std::shared_ptr<ModuleHooks> hooks);
// fully_shard's hooks on `module`, or nullptr.
ModuleHooks* find_hooks(torch::nn::Module& module);

template <typename Body>
at::Tensor hooked_forward(torch::nn::Module& module, Body&& body) {
  return nn::run_with_hooks(module, at::Tensor(), [&](const at::Tensor&) { return std::forward<Body>(body)(); });
}

// The same with the forward's input passed through the hooks (mixed precision casts it):
//   return hooked_forward(*this, x, [&](const at::Tensor& x) { return fc2(fc1(x).relu()); });
template <typename Body>
at::Tensor hooked_forward(torch::nn::Module& module, const at::Tensor& input, Body&& body) {
  return nn::run_with_hooks(module, input, std::forward<Body>(body));
}

}  // namespace hyperparallel::fsdp
