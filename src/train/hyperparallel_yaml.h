// HyperParallel's trainer YAML as a second config dialect (docs/hyperparallel-yaml.md).
//
// A file whose top level has HyperParallel's sections (`training`, or `model` holding
// `pretrained_model_name_or_path`) is read by translating it into this project's keys, which
// then go through the same checks as any config: model, training, accelerator, fsdp_config,
// plan_overrides (`when: tp | cp | ep`, `inner_wrapper`, `local_compute_fn`), mixed_precision,
// activation_checkpoint, compile, optimizer (adamw_config, muon_config), lr_scheduler,
// checkpoint, dataset, dataloader, debug. Every `_target_` naming one of HyperParallel's
// Python builders maps to a built-in here (target_table()); any other `_target_` is a
// problem naming it and the built-ins. Keys that have no effect on this build (the device
// backend, attention kernels, dataloader workers) are listed as ignored with the reason, as
// foreign keys of the LlamaFactory dialect are. Command-line overrides use HyperParallel's
// spelling (`--training.train_iters=5`) and translate the same way.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <utility>
#include <vector>

namespace hyperparallel::train::hp_yaml {

// Whether `root` is written in HyperParallel's dialect.
bool is_hyperparallel_config(const YAML::Node& root);

struct Translation {
  std::vector<std::pair<std::string, YAML::Node>> values;    // our key -> value
  std::vector<std::pair<std::string, std::string>> ignored;  // their key -> why it has no effect
  std::vector<std::string> problems;                         // one line each, naming the key and the fix
  // accelerator.cp_algorithm came from a `when: cp` plan override: it applies only if the
  // final cp_size (overrides included) is > 1.
  bool cp_algorithm_when_cp = false;
};

// The whole document; `source` names it in messages.
Translation translate(const YAML::Node& root, const std::string& source);
// One command-line override in HyperParallel's spelling: `key` (dotted) = `value`; the caller
// passes keys of our own dialect straight through.
Translation translate_override(const std::string& key, const YAML::Node& value);

// "_target_ suffix -> what it means here", one per line, for messages and docs.
std::string target_table();

}  // namespace hyperparallel::train::hp_yaml
