// Reading one config value: where it came from (for messages) and its checked conversions
// (bool, bounded integers and numbers, strings, lists of strings, one of a list of choices, a
// mapping). Every
// failure is a UserError of one line: "<source>: <key>: <value> is not allowed; expected
// <what>", the value cut to 120 characters (platform/suggest.h excerpt).
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hyperparallel::train {

// Where a value came from, for messages: "config.yaml" or "the command line".
struct Value {
  YAML::Node node;
  std::string source;
};

// Counts and steps beyond this are not a training run; a bound keeps products from overflowing.
constexpr int64_t kMaxCount = int64_t{1} << 40;
constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600;  // a week

[[noreturn]] void bad_value(const std::string& key, const Value& v, const std::string& allowed);
bool as_bool(const std::string& key, const Value& v);
// The scalar `auto`: a key whose value the run derives (train/loss_chunking.h, ...).
bool is_auto(const Value& v);
// true, false, or auto (unset).
std::optional<bool> as_bool_or_auto(const std::string& key, const Value& v);
int64_t as_int(const std::string& key, const Value& v, int64_t min, const std::string& allowed, int64_t max = kMaxCount);
double as_float(const std::string& key, const Value& v, double lo, double hi, bool lo_open, bool hi_open, const std::string& allowed);
std::string as_string(const std::string& key, const Value& v);
// A list of strings: a YAML sequence of scalars, one scalar, or (from the command line) a
// scalar holding a flow sequence such as [0-3, 4-7].
std::vector<std::string> as_string_list(const std::string& key, const Value& v, const std::string& allowed);
std::string as_choice(const std::string& key, const Value& v, const std::vector<std::string>& choices);
// A mapping in YAML, or (as HF's command line passes it) a JSON string of one.
YAML::Node as_mapping(const std::string& key, const Value& v);

}  // namespace hyperparallel::train
