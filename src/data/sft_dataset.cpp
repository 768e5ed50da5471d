// Reading alpaca / sharegpt / openai records. See data/sft_dataset.h; the sharegpt and openai
// rules are LlamaFactory's data/converter.py.
#include "hyperparallel/data/sft_dataset.h"

#include "dataset_records.h"
#include "hyperparallel/data/tool_calls.h"
#include "hyperparallel/platform/user_error.h"
#include "python_json.h"

namespace hyperparallel::data {
namespace {

using Json = nlohmann::ordered_json;

std::string read_tools(const Json& r, const SftLoadOptions& options);

// LlamaFactory's AlpacaDatasetConverter (it reads a tools column too).
Conversation from_alpaca(const Json& r, const SftLoadOptions& options) {
  const DatasetSchema& schema = options.schema;
  Conversation c;
  const std::string system = record_string(r, schema.system, false);
  if (!system.empty()) c.messages.push_back({"system", system});
  if (r.contains(schema.history) && !r[schema.history].is_null()) {
    const Json& history = r[schema.history];
    if (!history.is_array()) throw BadRecord{"\"" + schema.history + "\" must be a list of [user, assistant] pairs"};
    for (const auto& turn : history) {
      if (!turn.is_array() || turn.size() != 2 || !turn[0].is_string() || !turn[1].is_string()) {
        throw BadRecord{"\"" + schema.history + "\" entries must be [user, assistant] string pairs"};
      }
      c.messages.push_back({"user", turn[0].get<std::string>()});
      c.messages.push_back({"assistant", turn[1].get<std::string>()});
    }
  }
  const std::string instruction = record_string(r, schema.prompt, true);
  const std::string input = record_string(r, schema.query, false);
  c.messages.push_back({"user", input.empty() ? instruction : instruction + "\n" + input});
  c.messages.push_back({"assistant", record_string(r, schema.response, true)});
  c.tools = read_tools(r, options);
  return c;
}

bool tagged(const DatasetSchema& s) {
  return !s.user_tag.empty() || !s.assistant_tag.empty() || !s.system_tag.empty() || !s.observation_tag.empty() ||
         !s.function_tag.empty();
}

// The record's role name -> system | user | assistant | observation | function, by the
// schema's tags or, without them, any of the usual spellings.
std::string normalized_role(const std::string& role, const DatasetSchema& schema) {
  if (tagged(schema)) {
    const std::pair<const std::string*, const char*> tags[] = {{&schema.user_tag, "user"},
                                                               {&schema.assistant_tag, "assistant"},
                                                               {&schema.system_tag, "system"},
                                                               {&schema.observation_tag, "observation"},
                                                               {&schema.function_tag, "function"}};
    for (const auto& [tag, ours] : tags) {
      if (!tag->empty() && role == *tag) return ours;
    }
    throw BadRecord{"unknown role '" + role + "' (the dataset's tags name user '" + schema.user_tag + "', assistant '" +
                    schema.assistant_tag + "', system '" + schema.system_tag + "', observation '" + schema.observation_tag +
                    "', function '" + schema.function_tag + "')"};
  }
  if (role == "human" || role == "user") return "user";
  if (role == "gpt" || role == "assistant") return "assistant";
  if (role == "system") return "system";
  if (role == "observation" || role == "tool") return "observation";
  if (role == "function_call") return "function";
  throw BadRecord{"unknown role '" + role + "' (human/user, gpt/assistant, system, function_call, observation/tool)"};
}

// Where the turns are and what their fields are called.
struct TurnKeys {
  std::string list, role, content;
};

TurnKeys turn_keys(const Json& r, const DatasetSchema& schema) {
  TurnKeys k;
  k.list = schema.messages;
  if (k.list.empty()) k.list = r.contains("messages") ? "messages" : "conversations";
  const bool openai = k.list == "messages";
  k.role = !schema.role_tag.empty() ? schema.role_tag : openai ? "role" : "from";
  k.content = !schema.content_tag.empty() ? schema.content_tag : openai ? "content" : "value";
  if (!r.contains(k.list) || !r[k.list].is_array()) {
    throw BadRecord{schema.messages.empty() ? "needs \"conversations\" (from/value) or \"messages\" (role/content) as a list"
                                            : "needs \"" + k.list + "\" as a list"};
  }
  for (const auto& turn : r[k.list]) {
    if (!turn.is_object()) throw BadRecord{"\"" + k.list + "\" entries must be objects"};
  }
  return k;
}

// The tools column as LlamaFactory passes it on: a string as written, a list (or, from the
// openai converter, any object) as json.dumps writes it. Checked as data/tool_calls.h says.
std::string read_tools(const Json& r, const SftLoadOptions& options) {
  const std::string& key = options.schema.tools;
  if (key.empty() || !r.contains(key) || r[key].is_null()) return "";
  const Json& v = r[key];
  std::string tools;
  if (v.is_string()) {
    tools = v.get<std::string>();
  } else if (v.is_array() || v.is_object()) {
    tools = python_json_dumps(v);
  } else {
    throw BadRecord{"\"" + key + "\" must be a JSON list of tools, or a string holding one"};
  }
  if (tools.empty()) return "";
  try {
    check_tools(tools);
    if (!options.tool_format.empty()) format_tools(options.tool_format, tools, "01 Jan 2000");
  } catch (const UserError& e) {
    throw BadRecord{"\"" + key + "\": " + e.what()};
  }
  return tools;
}

void check_function_turn(const std::string& content, size_t turn, const SftLoadOptions& options) {
  try {
    check_function_call(content);
    if (!options.tool_format.empty()) format_function_call(options.tool_format, content);
  } catch (const UserError& e) {
    throw BadRecord{"turn " + std::to_string(turn) + " (function call): " + e.what()};
  }
}

// LlamaFactory's rule for both converters: after the system prompt, user|observation at even
// positions and assistant|function at odd ones, an even number of them. `turns[k]` names the
// record's turn of message k for messages; `first` is 1 when messages[0] is the system prompt.
void check_order(const Conversation& c, const std::vector<size_t>& turns, size_t first) {
  for (size_t i = first; i < c.messages.size(); ++i) {
    const std::string& role = c.messages[i].role;
    const bool prompt_side = (i - first) % 2 == 0;
    if (prompt_side ? (role != "user" && role != "observation") : (role != "assistant" && role != "function")) {
      throw BadRecord{"turn " + std::to_string(turns[i]) + " is " + role + ", expected " +
                      (prompt_side ? "user or observation" : "assistant or function") +
                      " (after an optional system, turns alternate user|observation and assistant|function)"};
    }
  }
  const size_t n = c.messages.size() - first;
  if (n == 0 || n % 2 != 0) throw BadRecord{"must end with an assistant turn (or a function call)"};
}

// The system prompt: the record's system column, or a first system turn, which wins over it
// (`start` then skips that turn).
std::string leading_system(const Json& r, const TurnKeys& k, const DatasetSchema& schema, size_t& start) {
  const Json& list = r[k.list];
  if (!list.empty() && normalized_role(record_string(list[0], k.role, true), schema) == "system") {
    start = 1;
    return record_string(list[0], k.content, true);
  }
  return record_string(r, schema.system, false);
}

Conversation from_sharegpt(const Json& r, const SftLoadOptions& options) {
  const DatasetSchema& schema = options.schema;
  const TurnKeys k = turn_keys(r, schema);
  const Json& list = r[k.list];
  Conversation c;
  std::vector<size_t> turns;
  size_t start = 0;
  const std::string system = leading_system(r, k, schema, start);
  if (!system.empty()) {
    c.messages.push_back({"system", system});
    turns.push_back(0);
  }
  for (size_t i = start; i < list.size(); ++i) {
    c.messages.push_back({normalized_role(record_string(list[i], k.role, true), schema), record_string(list[i], k.content, true)});
    turns.push_back(i);
  }
  check_order(c, turns, system.empty() ? 0 : 1);
  for (size_t i = 0; i < c.messages.size(); ++i) {
    if (c.messages[i].role == "function") check_function_turn(c.messages[i].content, turns[i], options);
  }
  c.tools = read_tools(r, options);
  return c;
}

// LlamaFactory's OpenAIDatasetConverter (formatting: openai).
Conversation from_openai(const Json& r, const SftLoadOptions& options) {
  const DatasetSchema& schema = options.schema;
  const TurnKeys k = turn_keys(r, schema);
  const Json& list = r[k.list];
  Conversation c;
  std::vector<size_t> turns;
  size_t start = 0;
  std::string system = leading_system(r, k, schema, start);
  std::vector<std::string> tool_responses;
  size_t tool_turn = 0;
  for (size_t i = start; i < list.size(); ++i) {
    const Json& turn = list[i];
    std::string role = normalized_role(record_string(turn, k.role, true), schema);
    std::string content;
    const bool calls = (role == "assistant" || role == "function") && turn.contains("tool_calls") &&
                       !turn["tool_calls"].is_null() && !(turn["tool_calls"].is_array() && turn["tool_calls"].empty());
    if (calls) {
      // The message's content is replaced by the JSON list of its calls' "function" objects.
      Json functions = Json::array();
      if (!turn["tool_calls"].is_array()) throw BadRecord{"turn " + std::to_string(i) + ": \"tool_calls\" must be a list"};
      for (const auto& call : turn["tool_calls"]) {
        if (!call.is_object() || !call.contains("function")) {
          throw BadRecord{"turn " + std::to_string(i) + ": \"tool_calls\" entries must be {\"type\": \"function\", \"function\": {...}}"};
        }
        functions.push_back(call["function"]);
      }
      content = python_json_dumps(functions);
      role = "function";
    } else {
      content = record_string(turn, k.content, true);
    }
    if (role == "observation") {
      if (tool_responses.empty()) tool_turn = i;
      tool_responses.push_back(content);
      continue;
    }
    if (!tool_responses.empty()) {
      std::string joined;
      for (size_t t = 0; t < tool_responses.size(); ++t) joined += (t ? "\n</tool_response>\n<tool_response>\n" : "") + tool_responses[t];
      c.messages.push_back({"observation", joined});
      turns.push_back(tool_turn);
      tool_responses.clear();
    }
    c.messages.push_back({role, content});
    turns.push_back(i);
  }
  // Tool messages after the last other turn are dropped, as LlamaFactory's converter drops them.
  check_order(c, turns, 0);
  for (size_t i = 0; i < c.messages.size(); ++i) {
    if (c.messages[i].role == "function") check_function_turn(c.messages[i].content, turns[i], options);
  }
  c.tools = read_tools(r, options);
  // The converter's system prompt rule (it was written for Ling's "detailed thinking" switch).
  const std::string kOff = "detailed thinking off";
  if (system.empty()) {
    if (c.tools.empty()) system = kOff;
  } else if (c.tools.empty()) {
    if (system.find("detailed thinking on") == std::string::npos && system.find(kOff) == std::string::npos) system += "\n" + kOff;
  } else {
    system += "\n";
  }
  if (!system.empty()) c.messages.insert(c.messages.begin(), {"system", system});
  return c;
}

size_t text_bytes(const Conversation& c) {
  size_t bytes = c.tools.size();
  for (const auto& m : c.messages) bytes += m.content.size();
  return bytes;
}

}  // namespace

DatasetFormat parse_dataset_format(const std::string& name) {
  if (name == "alpaca") return DatasetFormat::kAlpaca;
  if (name == "sharegpt") return DatasetFormat::kSharegpt;
  if (name == "openai") return DatasetFormat::kOpenai;
  throw UserError("dataset format '" + name + "' is not one of: alpaca, sharegpt, openai");
}

bool has_turns(const nlohmann::ordered_json& record, const DatasetSchema& schema) {
  if (!schema.messages.empty()) return record.contains(schema.messages);
  return record.contains("conversations") || record.contains("messages");
}

Conversation read_conversation(const nlohmann::ordered_json& record, DatasetFormat format, const SftLoadOptions& options) {
  if (format == DatasetFormat::kAuto) format = has_turns(record, options.schema) ? DatasetFormat::kSharegpt : DatasetFormat::kAlpaca;
  Conversation c = format == DatasetFormat::kAlpaca     ? from_alpaca(record, options)
                   : format == DatasetFormat::kSharegpt ? from_sharegpt(record, options)
                                                        : from_openai(record, options);
  check_record_bytes(text_bytes(c));
  return c;
}

std::vector<Conversation> load_sft_file(const std::string& path, DatasetFormat format, const SftLoadOptions& options,
                                        SftLoadReport* report) {
  if (has_suffix(path, ".txt")) {
    throw UserError(path + " is a plain-text file (one text per line), which trains with stage: pt; SFT reads alpaca, "
                    "sharegpt or openai records from .json / .jsonl files");
  }
  std::vector<Conversation> out;
  for_each_json_record(path, options, report, [&](const std::string& where, const Json& record) {
    Conversation c = read_conversation(record, format, options);
    c.source = where;
    out.push_back(std::move(c));
  });
  return out;
}

}  // namespace hyperparallel::data
