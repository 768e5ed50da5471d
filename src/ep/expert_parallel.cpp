// Expert parallelism applied to a model from outside. See ep/expert_parallel.h.
#include "hyperparallel/ep/expert_parallel.h"

#include <torch/nn/module.h>

#include "hyperparallel/dtensor/parameter_specs.h"
#include "hyperparallel/platform/user_error.h"
#include "models/moe.h"
#include "token_dispatch.h"

namespace hyperparallel::ep {
namespace {

struct NamedBlock {
  std::string name;
  models::SparseMoeBlock* block;
};

std::vector<NamedBlock> moe_blocks(torch::nn::Module& root) {
  std::vector<NamedBlock> out;
  for (const auto& item : root.named_modules()) {
    if (auto* block = dynamic_cast<models::SparseMoeBlock*>(item.value().get())) out.push_back({item.key(), block});
  }
  return out;
}

// Records every expert parameter of `block` (whole, before any is dropped) with its owner.
void record_owners(torch::nn::Module& root, const NamedBlock& b, const std::shared_ptr<comm::Communicator>& group) {
  const int64_t per_rank = b.block->num_experts / group->size();
  int64_t order = 0;
  for (int64_t e = 0; e < b.block->num_experts; ++e) {
    for (const auto& p : b.block->expert(e)->named_parameters()) {
      dtensor::ParameterOwner owner;
      owner.group = group;
      owner.owner = static_cast<int>(e / per_rank);
      owner.shape = p.value().sizes().vec();
      owner.dtype = p.value().scalar_type();
      owner.set = b.name + ".experts";
      owner.order = order++;
      dtensor::record_parameter_owner(root, b.name + ".experts." + std::to_string(e) + "." + p.key(), owner);
    }
  }
}

}  // namespace

std::string valid_ep_sizes(int64_t num_experts, int64_t limit) {
  std::string out;
  for (int64_t p = 1; p <= limit; ++p) {
    if (num_experts % p == 0) out += (out.empty() ? "" : ", ") + std::to_string(p);
  }
  return out;
}

std::vector<std::string> parallelize_experts(torch::nn::Module& root, const mesh::DeviceMesh& ep_mesh,
                                             const ExpertParallelOptions& options) {
  if (ep_mesh.ndim() != 1) throw UserError("parallelize_experts: ep_mesh " + ep_mesh.to_string() + " must be 1-D, e.g. mesh[\"ep\"]");
  const std::vector<NamedBlock> blocks = moe_blocks(root);
  if (blocks.empty()) throw UserError("expert parallelism needs a mixture-of-experts model; this one has no sparse MoE block");
  const std::shared_ptr<comm::Communicator> group = ep_mesh.comm();
  const int64_t ranks = group->size();
  std::vector<std::string> names;
  for (const NamedBlock& b : blocks) {
    const int64_t experts = b.block->num_experts;
    if (experts % ranks != 0) {
      throw UserError("ep size " + std::to_string(ranks) + " does not divide the " + std::to_string(experts) + " experts of " +
                      b.name + "; valid ep sizes: " + valid_ep_sizes(experts, experts));
    }
    // grouped_experts (a local dispatch) gives way: the all-to-all dispatch groups the same way.
    if (std::dynamic_pointer_cast<AllToAllDispatch>(b.block->dispatch)) {
      throw UserError("parallelize_experts: " + b.name + " is already expert-parallel");
    }
    record_owners(root, b, group);
    const int64_t per_rank = experts / ranks;
    b.block->keep_experts(group->rank() * per_rank, per_rank);
    b.block->dispatch = std::make_shared<AllToAllDispatch>(group, options.token_split);
    names.push_back(b.name);
  }
  return names;
}

void set_expert_capacity(torch::nn::Module& root, double factor) {
  if (!(factor >= 0)) throw UserError("expert capacity factor " + std::to_string(factor) + " must be >= 0 (0: dropless)");
  for (const NamedBlock& b : moe_blocks(root)) b.block->capacity_factor = factor;
}

ExpertLoad take_expert_load(torch::nn::Module& root) {
  ExpertLoad load;
  for (const NamedBlock& b : moe_blocks(root)) {
    load.routed += b.block->routed_pairs;
    load.dropped += b.block->dropped_pairs;
    b.block->routed_pairs = b.block->dropped_pairs = 0;
  }
  return load;
}

std::vector<torch::nn::Module*> expert_modules(torch::nn::Module& root) {
  std::vector<torch::nn::Module*> out;
  for (const NamedBlock& b : moe_blocks(root)) out.push_back(b.block->experts.get());
  return out;
}

}  // namespace hyperparallel::ep
