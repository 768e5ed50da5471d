// Checked config values. See config_values.h.
#include "config_values.h"

#include <cmath>

#include "hyperparallel/platform/suggest.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::train {

[[noreturn]] void bad_value(const std::string& key, const Value& v, const std::string& allowed) {
  std::string text = v.node.IsScalar() ? excerpt(v.node.Scalar()) : v.node.IsSequence() ? "a list" : "a mapping";
  throw UserError(v.source + ": " + key + ": " + text + " is not allowed; expected " + allowed);
}

bool as_bool(const std::string& key, const Value& v) {
  bool out = false;
  if (!v.node.IsScalar() || !YAML::convert<bool>::decode(v.node, out)) bad_value(key, v, "true or false");
  return out;
}

bool is_auto(const Value& v) { return v.node.IsScalar() && v.node.Scalar() == "auto"; }

std::optional<bool> as_bool_or_auto(const std::string& key, const Value& v) {
  if (is_auto(v)) return std::nullopt;
  bool out = false;
  if (!v.node.IsScalar() || !YAML::convert<bool>::decode(v.node, out)) bad_value(key, v, "true, false or auto");
  return out;
}

int64_t as_int(const std::string& key, const Value& v, int64_t min, const std::string& allowed, int64_t max) {
  int64_t out = 0;
  if (!v.node.IsScalar() || !YAML::convert<int64_t>::decode(v.node, out) || out < min) bad_value(key, v, allowed);
  if (out > max) bad_value(key, v, "an integer <= " + std::to_string(max));
  return out;
}

double as_float(const std::string& key, const Value& v, double lo, double hi, bool lo_open, bool hi_open, const std::string& allowed) {
  double out = 0;
  if (!v.node.IsScalar() || !YAML::convert<double>::decode(v.node, out) || !std::isfinite(out) || out < lo || out > hi ||
      (lo_open && out == lo) || (hi_open && out == hi)) {
    bad_value(key, v, allowed);
  }
  return out;
}

std::string as_string(const std::string& key, const Value& v) {
  if (!v.node.IsScalar()) bad_value(key, v, "a string");
  return v.node.Scalar();
}

std::vector<std::string> as_string_list(const std::string& key, const Value& v, const std::string& allowed) {
  YAML::Node node = v.node;
  if (node.IsScalar() && !node.Scalar().empty() && node.Scalar().front() == '[') {
    try {
      node = YAML::Load(node.Scalar());
    } catch (const YAML::Exception&) {
      bad_value(key, v, allowed);
    }
  }
  if (node.IsScalar()) return {node.Scalar()};
  if (!node.IsSequence()) bad_value(key, v, allowed);
  std::vector<std::string> out;
  for (const auto& e : node) {
    if (!e.IsScalar()) bad_value(key, v, allowed);
    out.push_back(e.Scalar());
  }
  return out;
}

std::string as_choice(const std::string& key, const Value& v, const std::vector<std::string>& choices) {
  std::string allowed;
  for (const auto& c : choices) allowed += (allowed.empty() ? "" : " | ") + c;
  if (!v.node.IsScalar()) bad_value(key, v, allowed);
  const std::string s = v.node.Scalar();
  for (const auto& c : choices) {
    if (s == c) return s;
  }
  bad_value(key, v, allowed + did_you_mean(s, choices));
}

YAML::Node as_mapping(const std::string& key, const Value& v) {
  if (v.node.IsMap()) return v.node;
  if (v.node.IsScalar()) {
    try {
      YAML::Node parsed = YAML::Load(v.node.Scalar());
      if (parsed.IsMap()) return parsed;
    } catch (const YAML::Exception&) {
    }
  }
  bad_value(key, v, "a mapping (or a JSON object string)");
}

}  // namespace hyperparallel::train
