// Parameter specs recorded on the model: the layout a parallelism gave each parameter it
// split, kept on the root module itself (a parameter-free child "_hp_parameter_specs"), so
// state dicts, checkpoints, loading and the gradient norm read layouts without knowing which
// parallelism made them. A parameter without a spec is whole on its mesh (FSDP may still
// shard it; fsdp/fully_shard.h composes the two).
// Names are full parameter names relative to `root` — the module the parallelism was applied
// to (the CausalLM for the trainer).
//
// Owned parameters are the other kind of split: whole parameters divided among the ranks of a
// group, each held by one of them (expert parallelism: an expert's weights live on one ep
// rank). Every rank records every such parameter, held here or not, so the full model's names
// and shapes are known everywhere and whole-model views (full_parameters, loading checks, the
// gradient norm) can reach the rest over the group.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/dtensor/dtensor_spec.h"

namespace torch::nn {
class Module;
}

namespace hyperparallel::dtensor {

void record_parameter_spec(torch::nn::Module& root, const std::string& name, const DTensorSpec& spec);
// The recorded spec of `name`, or null.
const DTensorSpec* find_parameter_spec(torch::nn::Module& root, const std::string& name);
// Every recorded spec by name (empty when none).
const std::map<std::string, DTensorSpec>& parameter_specs(torch::nn::Module& root);

// The local piece of `name` that this rank holds, as a box of the global tensor; the whole
// tensor when no spec was recorded (local_shape is then the global shape).
Box parameter_box(torch::nn::Module& root, const std::string& name, const std::vector<int64_t>& local_shape);

struct ParameterOwner {
  std::shared_ptr<comm::Communicator> group;  // the ranks the parameters are divided among
  int owner = 0;                              // the group rank that holds this one
  std::vector<int64_t> shape;                 // its (whole) shape
  at::ScalarType dtype = at::kFloat;          // its dtype (what the holder broadcasts)
  std::string set;                            // the parameters divided together (an MoE block's experts)
  int64_t order = 0;                          // its position in the set, in the unsplit model's order
  bool held_here() const { return group->rank() == owner; }
};
void record_parameter_owner(torch::nn::Module& root, const std::string& name, const ParameterOwner& owner);
// Every recorded owned parameter by name, held here or not (empty when none).
const std::map<std::string, ParameterOwner>& parameter_owners(torch::nn::Module& root);
// Every parameter name of the whole model in the unsplit model's named_parameters() order:
// this rank's, with each set of owned parameters complete where its first local member is.
std::vector<std::string> full_parameter_names(torch::nn::Module& root);

}  // namespace hyperparallel::dtensor
