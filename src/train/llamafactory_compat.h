// The keys LlamaFactory and the Hugging Face Trainer define that are not ours, and the
// HyperParallel integration's JSON, so their configs run unchanged.
//
// Every such key has one of two dispositions, and a reason a user can act on:
//   ignored          it changes nothing a run here computes (logging back-ends, data loader
//                    workers, CUDA kernels, arguments of stages or tuning methods that are
//                    refused on their own): accepted, listed once when training starts;
//   refused when on  it asks for a feature this trainer does not have (LoRA's quantisation,
//                    GaLore, label smoothing, ...): its off value (false, null, 0, "none",
//                    "no") is accepted silently, any other value is an error saying what to
//                    do instead.
// Keys that do change the run (ddp_timeout, deepspeed, optim, save_strategy, report_to,
// lr_scheduler_kwargs, default_system, mask_history, neat_packing, hyper_parallel_args, ...)
// are ordinary keys of the schema in train_config.cpp, not here. The table is the one place a
// new upstream key is classified; docs/config.md lists every entry (a test keeps them in step).
//
// hyper_parallel_args names a JSON file of HyperParallel's LlamaFactory integration
// (HyperParallelArguments: tp_size, cp_size, ep_size, efsdp_size, fsdp_size, param_dtype,
// reduce_dtype, reshard_after_forward, activation_mode, ...); read_hyper_parallel_args turns
// it into our keys, so the same file configures both.
#pragma once

#include <yaml-cpp/node/node.h>

#include <string>
#include <utility>
#include <vector>

namespace hyperparallel::train::compat {

enum class Disposition { kIgnored, kRefusedWhenOn };

struct ForeignKey {
  std::string key;
  Disposition disposition;
  std::string why;  // ignored: why it has no effect; refused: what to do instead
};

const std::vector<ForeignKey>& foreign_keys();
const ForeignKey* find_foreign_key(const std::string& key);

// Whether a value asks for the feature: anything but false, null, 0, "", "none", "no", "false".
bool turns_on(const YAML::Node& value);

// (our key, value) pairs from a hyper_parallel_args JSON file; UserError naming the file and
// the entry for anything unreadable, unknown or not implemented here.
std::vector<std::pair<std::string, YAML::Node>> read_hyper_parallel_args(const std::string& path);

}  // namespace hyperparallel::train::compat
