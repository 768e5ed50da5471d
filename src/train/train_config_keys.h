// The table of configuration keys: every key of a training config (docs/config.md) with its
// type, default and meaning (config_schema(), frozen in tests/fixtures/config_schema.txt) and
// the setter that checks a value and stores it in a TrainConfig. Keys inside a section are
// written with dots ("fsdp_config.dp_shard_size"); sections() names the sections, which a
// value alone may not set. train_config.cpp reads YAML and the command line through this
// table; the checks across keys stay there.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "hyperparallel/train/train_config.h"

namespace hyperparallel::train {

struct Value;  // config_values.h

using Setter = std::function<void(TrainConfig&, const std::string& key, const Value&)>;

struct KeyDef {
  ConfigKeyInfo info;
  Setter set;
};

const std::vector<KeyDef>& key_table();
const std::set<std::string>& sections();
const KeyDef* find_key(const std::string& key);  // nullptr: no such key
std::vector<std::string> all_keys();

}  // namespace hyperparallel::train
