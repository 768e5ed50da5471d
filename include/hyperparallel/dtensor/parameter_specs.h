// Parameter specs recorded on the model: the layout a parallelism gave each parameter it
// split, kept on the root module itself (a parameter-free child "_hp_parameter_specs"), so
// state dicts, checkpoints, loading and the gradient norm read layouts without knowing which
// parallelism made them. A parameter without a spec is whole on its mesh (FSDP may still
// shard it; fsdp/fully_shard.h composes the two).
// Names are full parameter names relative to `root` — the module the parallelism was applied
// to (the CausalLM for the trainer).
#pragma once

#include <map>
#include <string>

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

}  // namespace hyperparallel::dtensor
