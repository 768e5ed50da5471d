#include "hyperparallel/fsdp/module_hooks.h"

#include <torch/nn/module.h>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::fsdp {
namespace {

constexpr const char* kHooksChild = "_hp_hooks";

// A parameter-free child module that carries the hooks.
class HooksHolder : public torch::nn::Module {
 public:
  explicit HooksHolder(std::shared_ptr<ModuleHooks> hooks) : hooks_(std::move(hooks)) {}
  ModuleHooks* hooks() const { return hooks_.get(); }

 private:
  std::shared_ptr<ModuleHooks> hooks_;
};

}  // namespace

void attach_hooks(torch::nn::Module& module, std::shared_ptr<ModuleHooks> hooks) {
  if (find_hooks(module)) {
    throw UserError("module " + module.name() + " already has hooks (fully_shard applied twice?)");
  }
  module.register_module(kHooksChild, std::make_shared<HooksHolder>(std::move(hooks)));
}

ModuleHooks* find_hooks(torch::nn::Module& module) {
  const auto children = module.named_children();
  const auto* holder = children.find(kHooksChild);
  if (!holder) return nullptr;
  auto* typed = dynamic_cast<HooksHolder*>(holder->get());
  return typed ? typed->hooks() : nullptr;
}

}  // namespace hyperparallel::fsdp
