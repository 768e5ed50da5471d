// LlamaFactory's tool formats. See data/tool_calls.h; the prompts are in tool_prompts.h.
#include "hyperparallel/data/tool_calls.h"

#include <algorithm>
#include <ctime>

#include "hyperparallel/platform/suggest.h"
#include "hyperparallel/platform/user_error.h"
#include "python_json.h"
#include "tool_prompts.h"

namespace hyperparallel::data {
namespace {

using namespace tool_prompts;

// LlamaFactory's formats that are not implemented here (its tool_utils.TOOLS).
const std::vector<std::string> kNotImplemented = {"gemma4", "glm4",     "glm4_moe", "lfm2",     "ling",
                                                  "minimax1", "minimax2", "mistral",  "qwen3_5", "seed_oss"};

OrderedJson parse(const std::string& text, const std::string& what) {
  OrderedJson value;
  std::string error;
  if (!python_json_loads(text, value, error)) throw UserError(what + " is " + error);
  return value;
}

std::string type_name(const OrderedJson& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "a list";
  if (v.is_string()) return "a string";
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  return "a number";
}

// Python's truth value of the parsed value.
bool truthy(const OrderedJson& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_float()) return v.get<double>() != 0;
  if (v.is_number()) return v != 0;
  return !v.empty();  // string, list, object
}

// Python's str() of a scalar, as str.format writes it; lists and objects (Python's repr) are refused.
std::string python_str(const OrderedJson& v, const std::string& what) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_number_float()) return python_float_repr(v.get<double>());
  if (v.is_number()) return python_json_dumps(v);
  throw UserError(what + " is " + type_name(v) + ", which the default tool format writes with Python's str(); that is not "
                  "reproduced here: make it a string");
}

// The tools as a list of objects.
OrderedJson parse_tools(const std::string& tools) {
  OrderedJson list = parse(tools, "tools");
  if (!list.is_array()) throw UserError("tools is " + type_name(list) + "; it must be a JSON list of function descriptions");
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_object()) {
      throw UserError("tools entry " + std::to_string(i) + " is " + type_name(list[i]) + "; each tool must be an object");
    }
  }
  return list;
}

bool is_function_wrapper(const OrderedJson& tool) { return tool.contains("type") && tool["type"] == "function"; }

// {"type": "function", "function": tool} unless the tool already is one (qwen, llama3).
OrderedJson wrapped(const OrderedJson& tool) {
  if (is_function_wrapper(tool)) return tool;
  OrderedJson out = OrderedJson::object();
  out["type"] = "function";
  out["function"] = tool;
  return out;
}

// DefaultToolUtils.tool_formatter.
std::string default_tools(const OrderedJson& tools) {
  std::string tool_text, tool_names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = "tools entry " + std::to_string(i);
    OrderedJson tool = tools[i];
    if (is_function_wrapper(tool)) {
      if (!tool.contains("function") || !tool["function"].is_object()) {
        throw UserError(where + " has \"type\": \"function\" but no \"function\" object");
      }
      tool = OrderedJson(tool["function"]);
    }
    if (!tool.contains("name") || !tool["name"].is_string()) throw UserError(where + " needs a string \"name\"");
    const std::string name = tool["name"].get<std::string>();
    const std::string at = where + " (" + name + ")";
    if (!tool.contains("parameters") || !tool["parameters"].is_object() || !tool["parameters"].contains("properties") ||
        !tool["parameters"]["properties"].is_object()) {
      throw UserError(at + " needs \"parameters\": {\"properties\": {...}} (the default tool format lists them)");
    }
    const OrderedJson& parameters = tool["parameters"];
    const OrderedJson required = parameters.contains("required") ? parameters["required"] : OrderedJson::array();
    std::string param_text;
    for (auto it = parameters["properties"].begin(); it != parameters["properties"].end(); ++it) {
      const std::string& param_name = it.key();
      const OrderedJson& param = it.value();
      const std::string pat = at + " parameter " + param_name;
      if (!param.is_object()) throw UserError(pat + " is " + type_name(param) + "; it must be an object");
      bool is_required = false;  // Python's `name in required`
      if (required.is_array()) {
        is_required = std::any_of(required.begin(), required.end(), [&](const OrderedJson& r) { return r == param_name; });
      } else if (required.is_string()) {
        is_required = required.get<std::string>().find(param_name) != std::string::npos;
      } else if (required.is_object()) {
        is_required = required.contains(param_name);
      } else {
        throw UserError(at + " \"required\" is " + type_name(required) + "; it must be a list of parameter names");
      }
      std::string enum_text;
      if (param.contains("enum") && truthy(param["enum"])) {
        if (!param["enum"].is_array()) throw UserError(pat + " \"enum\" is " + type_name(param["enum"]) + "; it must be a list of strings");
        std::string joined;
        for (const auto& e : param["enum"]) {
          if (!e.is_string()) throw UserError(pat + " \"enum\" holds " + type_name(e) + "; the default tool format joins strings only");
          joined += (joined.empty() ? "" : ", ") + e.get<std::string>();
        }
        enum_text = ", should be one of [" + joined + "]";
      }
      std::string items_text;
      if (param.contains("items") && truthy(param["items"])) {
        if (!param["items"].is_object()) throw UserError(pat + " \"items\" is " + type_name(param["items"]) + "; it must be an object");
        const OrderedJson& items = param["items"];
        items_text = ", where each item should be " + (items.contains("type") ? python_str(items["type"], pat + " items \"type\"") : "");
      }
      param_text += "  - " + param_name + " (" + (param.contains("type") ? python_str(param["type"], pat + " \"type\"") : "") +
                    (is_required ? ", required" : "") + "): " +
                    (param.contains("description") ? python_str(param["description"], pat + " \"description\"") : "") + enum_text +
                    items_text + "\n";
    }
    const std::string description = tool.contains("description") ? python_str(tool["description"], at + " \"description\"") : "";
    tool_text += "> Tool Name: " + name + "\nTool Description: " + description + "\nTool Args:\n" + param_text + "\n";
    tool_names += (tool_names.empty() ? "" : ", ") + name;
  }
  return kDefaultBefore + tool_text + kDefaultMiddle + tool_names + kDefaultAfter;
}

struct FunctionCall {
  std::string name;
  OrderedJson arguments;
};

// Every non-overlapping copy of `what` removed, left to right (Python's str.replace(what, "")).
std::string remove_all(const std::string& text, const std::string& what) {
  std::string out;
  size_t start = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, start)) {
    out += text.substr(start, at - start);
    start = at + what.size();
  }
  return out + text.substr(start);
}

// FunctionFormatter.apply before the tool format writes the calls: the text kept in front of
// them and the calls, with the default tool_call_words and thought_words of every template here.
struct ParsedFunction {
  std::string prefix;
  std::vector<FunctionCall> calls;
};

ParsedFunction parse_function(const std::string& content) {
  ParsedFunction out;
  std::string json_text = content;
  const size_t open = content.find("<tool_call>");
  const size_t close = open == std::string::npos ? std::string::npos : content.find("</tool_call>", open + 11);
  if (close != std::string::npos) {
    json_text = content.substr(open + 11, close - open - 11);
    out.prefix = remove_all(content, content.substr(open, close + 12 - open));
  } else {
    const size_t think = content.find("<think>\n");
    const size_t think_end = think == std::string::npos ? std::string::npos : content.find("\n</think>\n\n", think + 8);
    if (think_end != std::string::npos) {
      out.prefix = content.substr(think, think_end + 11 - think);
      json_text = remove_all(content, out.prefix);
    }
  }
  OrderedJson calls = parse(json_text, "the function call");
  if (!calls.is_array()) calls = OrderedJson::array({calls});
  for (const auto& call : calls) {
    if (!call.is_object() || !call.contains("name") || !call.contains("arguments")) {
      throw UserError("the function call must be {\"name\": ..., \"arguments\": ...} or a list of them; it holds " +
                      (call.is_object() ? "an object without \"" + std::string(call.contains("name") ? "arguments" : "name") + "\""
                                        : type_name(call)));
    }
    if (!call["name"].is_string()) throw UserError("the function call's \"name\" is " + type_name(call["name"]) + "; it must be a string");
    out.calls.push_back({call["name"].get<std::string>(), call["arguments"]});
  }
  return out;
}

std::string format_calls(const std::string& format, const std::vector<FunctionCall>& calls) {
  std::string out;
  if (format == "qwen") {
    for (const auto& call : calls) {
      OrderedJson o = OrderedJson::object();
      o["name"] = call.name;
      o["arguments"] = call.arguments;
      out += (out.empty() ? "" : "\n") + std::string("<tool_call>\n") + python_json_dumps(o) + "\n</tool_call>";
    }
  } else if (format == "llama3") {
    OrderedJson objects = OrderedJson::array();
    for (const auto& call : calls) {
      OrderedJson o = OrderedJson::object();
      o["name"] = call.name;
      o["parameters"] = call.arguments;
      objects.push_back(std::move(o));
    }
    out = python_json_dumps(objects.size() == 1 ? objects[0] : objects);
  } else {
    for (const auto& call : calls) {
      out += std::string(out.empty() ? "" : "\n") + "Action: " + call.name + "\nAction Input: " + python_json_dumps(call.arguments);
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> tool_format_names() { return {"default", "llama3", "qwen"}; }

void check_tool_format(const std::string& format) {
  const auto names = tool_format_names();
  if (std::find(names.begin(), names.end(), format) != names.end()) return;
  if (std::find(kNotImplemented.begin(), kNotImplemented.end(), format) != kNotImplemented.end()) {
    throw UserError("tool_format " + format + " is LlamaFactory's but not implemented here; implemented: " + join_names(names));
  }
  throw UserError("tool_format '" + format + "' is not a tool format" + did_you_mean(format, names) +
                  "; implemented: " + join_names(names));
}

std::string format_tools(const std::string& format, const std::string& tools, const std::string& date) {
  check_tool_format(format);
  const OrderedJson list = parse_tools(tools);
  if (list.empty()) return "";
  std::string tool_text;
  if (format == "qwen") {
    for (const auto& tool : list) tool_text += "\n" + python_json_dumps(wrapped(tool));
    return kQwenBefore + tool_text + kQwenAfter;
  }
  if (format == "llama3") {
    for (const auto& tool : list) tool_text += python_json_dumps(wrapped(tool), 4) + "\n\n";
    return kLlama3BeforeDate + date + kLlama3AfterDate + tool_text;
  }
  return default_tools(list);
}

std::string format_function_call(const std::string& format, const std::string& content) {
  check_tool_format(format);
  const ParsedFunction parsed = parse_function(content);
  return parsed.prefix + format_calls(format, parsed.calls);
}

void check_tools(const std::string& tools) { parse_tools(tools); }

void check_function_call(const std::string& content) { parse_function(content); }

std::string today_tool_date() {
  static const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char day[4];
  std::snprintf(day, sizeof(day), "%02d", local.tm_mday);
  return std::string(day) + " " + kMonths[local.tm_mon] + " " + std::to_string(local.tm_year + 1900);
}

}  // namespace hyperparallel::data
