// JSON as Python's json module reads and writes it, for the tool-call text that LlamaFactory
// builds with json.loads / json.dumps(..., ensure_ascii=False) (data/tool_calls.h).
//
// python_json_dumps writes exactly what json.dumps(value, ensure_ascii=False[, indent=N])
// writes: separators ", " and ": " (with an indent: "," at line ends), object keys in their
// order, non-ASCII characters as they are, '"', '\\' and control characters escaped
// (\n \r \t \b \f, else \u00xx in lowercase hex), integers as written, floats as Python's
// repr (the shortest digits that read back, fixed notation for exponents in [-4, 16),
// "1.0" for whole numbers, "1e-05" / "1e+16" otherwise). Values are nlohmann::ordered_json, so
// key order survives; nlohmann's own dump() sorts nothing either, but its separators and
// float spellings are not Python's.
//
// python_json_loads parses as json.loads does for valid JSON, keeping key order (a repeated
// key keeps its first place and its last value, as a Python dict does). What Python accepts
// and this does not is reported, never approximated: NaN / Infinity literals, and integers
// beyond 64 bits (Python keeps them exact; a double would change their digits). Nesting is
// bounded by io::kMaxUserJsonDepth.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace hyperparallel::data {

using OrderedJson = nlohmann::ordered_json;

// indent < 0: Python's indent=None (one line).
std::string python_json_dumps(const OrderedJson& value, int indent = -1);

// Python's repr() of a float.
std::string python_float_repr(double value);

// The parsed value, or false with `error` saying what is wrong.
bool python_json_loads(const std::string& text, OrderedJson& value, std::string& error);

}  // namespace hyperparallel::data
