// Python's json.dumps / json.loads. See python_json.h.
#include "python_json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "hyperparallel/io/user_files.h"

namespace hyperparallel::data {
namespace {

void write_string(std::string& out, const std::string& s) {
  static const char* kHex = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void newline(std::string& out, int indent, int level) {
  out += '\n';
  out.append(static_cast<size_t>(indent) * static_cast<size_t>(level), ' ');
}

void write_value(std::string& out, const OrderedJson& v, int indent, int level) {
  switch (v.type()) {
    case OrderedJson::value_t::null: out += "null"; return;
    case OrderedJson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; return;
    case OrderedJson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); return;
    case OrderedJson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); return;
    case OrderedJson::value_t::number_float: out += python_float_repr(v.get<double>()); return;
    case OrderedJson::value_t::string: write_string(out, v.get_ref<const std::string&>()); return;
    case OrderedJson::value_t::array: {
      if (v.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += indent < 0 ? ", " : ",";
        first = false;
        if (indent >= 0) newline(out, indent, level + 1);
        write_value(out, item, indent, level + 1);
      }
      if (indent >= 0) newline(out, indent, level);
      out += ']';
      return;
    }
    case OrderedJson::value_t::object: {
      if (v.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += indent < 0 ? ", " : ",";
        first = false;
        if (indent >= 0) newline(out, indent, level + 1);
        write_string(out, it.key());
        out += ": ";
        write_value(out, it.value(), indent, level + 1);
      }
      if (indent >= 0) newline(out, indent, level);
      out += '}';
      return;
    }
    default: out += "null"; return;  // binary / discarded do not come from parsing text
  }
}

// The first integer literal outside strings that does not fit 64 bits, or "".
std::string oversized_integer(const std::string& text) {
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      continue;
    }
    if (c != '-' && (c < '0' || c > '9')) continue;
    size_t end = i;
    bool integral = true;
    while (end < text.size() && std::string("0123456789+-.eE").find(text[end]) != std::string::npos) {
      if (text[end] == '.' || text[end] == 'e' || text[end] == 'E') integral = false;
      ++end;
    }
    const std::string token = text.substr(i, end - i);
    i = end - 1;
    if (!integral) continue;
    errno = 0;
    if (token[0] == '-') {
      (void)std::strtoll(token.c_str(), nullptr, 10);
    } else {
      (void)std::strtoull(token.c_str(), nullptr, 10);
    }
    if (errno == ERANGE) return token;
  }
  return "";
}

}  // namespace

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value < 0 ? "-Infinity" : "Infinity";
  // The shortest digits that read back (ties: the nearest), as "d.ddde±x".
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  const std::string sci(buf, result.ptr);
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exponent = std::atoi(sci.c_str() + e + 1);
  std::string sign;
  if (!mantissa.empty() && mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (const char c : mantissa) {
    if (c != '.') digits += c;
  }
  const int n = static_cast<int>(digits.size());
  const int point = exponent + 1;  // digits before the decimal point
  if (exponent >= -4 && exponent < 16) {
    if (point <= 0) return sign + "0." + std::string(static_cast<size_t>(-point), '0') + digits;
    if (point >= n) return sign + digits + std::string(static_cast<size_t>(point - n), '0') + ".0";
    return sign + digits.substr(0, static_cast<size_t>(point)) + "." + digits.substr(static_cast<size_t>(point));
  }
  std::string out = sign + digits.substr(0, 1);
  if (n > 1) out += "." + digits.substr(1);
  const int magnitude = std::abs(exponent);
  out += exponent < 0 ? "e-" : "e+";
  if (magnitude < 10) out += '0';
  return out + std::to_string(magnitude);
}

std::string python_json_dumps(const OrderedJson& value, int indent) {
  std::string out;
  write_value(out, value, indent, 0);
  return out;
}

bool python_json_loads(const std::string& text, OrderedJson& value, std::string& error) {
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) {
    error = "not valid JSON (it starts with a byte-order mark)";
    return false;
  }
  if (!io::json_nesting_within(text.data(), text.size(), io::kMaxUserJsonDepth)) {
    error = "nests JSON deeper than " + std::to_string(io::kMaxUserJsonDepth) + " levels";
    return false;
  }
  try {
    value = OrderedJson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    error = std::string("not valid JSON (") + e.what() + ")";
    return false;
  }
  const std::string big = oversized_integer(text);
  if (!big.empty()) {
    error = "holds the integer " + (big.size() > 40 ? big.substr(0, 40) + "..." : big) +
            ", which does not fit 64 bits (Python keeps such integers exact; write it as a string)";
    return false;
  }
  return true;
}

}  // namespace hyperparallel::data
