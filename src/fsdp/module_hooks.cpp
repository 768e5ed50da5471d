#include "hyperparallel/fsdp/module_hooks.h"

#include <torch/nn/module.h>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::fsdp {
namespace {

// fully_shard's pre/post steps as one entry of the stack: all-gather before the hooks inside
// it (and the body) run, reshard and gradient hooks after.
class FsdpForwardHook : public nn::ForwardHook {
 public:
  explicit FsdpForwardHook(std::shared_ptr<ModuleHooks> hooks) : hooks_(std::move(hooks)) {}
  at::Tensor around(const at::Tensor& input, const nn::Forward& next) override {
    hooks_->pre_forward();
    return hooks_->post_forward(next(input.defined() ? hooks_->cast_input(input) : input));
  }
  ModuleHooks* hooks() const { return hooks_.get(); }

 private:
  std::shared_ptr<ModuleHooks> hooks_;
};

}  // namespace

void attach_hooks(torch::nn::Module& module, std::shared_ptr<ModuleHooks> hooks) {
  if (find_hooks(module)) {
    throw UserError("module " + module.name() + " already has hooks (fully_shard applied twice?)");
  }
  nn::add_forward_hook(module, std::make_shared<FsdpForwardHook>(std::move(hooks)));
}

ModuleHooks* find_hooks(torch::nn::Module& module) {
  for (const auto& hook : nn::forward_hooks(module)) {
    if (auto* fsdp = dynamic_cast<FsdpForwardHook*>(hook.get())) return fsdp->hooks();
  }
  return nullptr;
}

}  // namespace hyperparallel::fsdp
