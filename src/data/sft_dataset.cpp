// Reading alpaca / sharegpt records. See data/sft_dataset.h.
#include "hyperparallel/data/sft_dataset.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hyperparallel/io/user_files.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::data {
namespace {

using Json = nlohmann::json;

// A record that cannot become a conversation; the message says what is wrong.
struct BadRecord {
  std::string what;
};

std::string string_field(const Json& record, const std::string& key, bool required) {
  if (!record.contains(key) || record[key].is_null()) {
    if (required) throw BadRecord{"missing \"" + key + "\""};
    return "";
  }
  if (!record[key].is_string()) throw BadRecord{"\"" + key + "\" must be a string"};
  return record[key].get<std::string>();
}

Conversation from_alpaca(const Json& r, const DatasetSchema& schema) {
  Conversation c;
  const std::string system = string_field(r, schema.system, false);
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
  const std::string instruction = string_field(r, schema.prompt, true);
  const std::string input = string_field(r, schema.query, false);
  c.messages.push_back({"user", input.empty() ? instruction : instruction + "\n" + input});
  c.messages.push_back({"assistant", string_field(r, schema.response, true)});
  return c;
}

// The record's role name -> system | user | assistant, by the schema's tags or, without them,
// either spelling.
std::string normalized_role(const std::string& role, const DatasetSchema& schema) {
  if (!schema.user_tag.empty() || !schema.assistant_tag.empty() || !schema.system_tag.empty()) {
    if (role == schema.user_tag) return "user";
    if (role == schema.assistant_tag) return "assistant";
    if (role == schema.system_tag) return "system";
    throw BadRecord{"unknown role '" + role + "' (the dataset's tags name user '" + schema.user_tag + "', assistant '" +
                    schema.assistant_tag + "', system '" + schema.system_tag + "')"};
  }
  if (role == "human" || role == "user") return "user";
  if (role == "gpt" || role == "assistant") return "assistant";
  if (role == "system") return "system";
  throw BadRecord{"unknown role '" + role + "' (human/user, gpt/assistant, system; tool turns are not supported yet)"};
}

Conversation from_sharegpt(const Json& r, const DatasetSchema& schema) {
  std::string list_key = schema.messages;
  if (list_key.empty()) list_key = r.contains("messages") ? "messages" : "conversations";
  const bool openai = list_key == "messages";
  const std::string role_key = !schema.role_tag.empty() ? schema.role_tag : openai ? "role" : "from";
  const std::string content_key = !schema.content_tag.empty() ? schema.content_tag : openai ? "content" : "value";
  if (!r.contains(list_key) || !r[list_key].is_array()) {
    throw BadRecord{schema.messages.empty() ? "needs \"conversations\" (from/value) or \"messages\" (role/content) as a list"
                                            : "needs \"" + list_key + "\" as a list"};
  }
  Conversation c;
  const std::string system = string_field(r, schema.system, false);
  if (!system.empty()) c.messages.push_back({"system", system});
  for (const auto& turn : r[list_key]) {
    if (!turn.is_object()) throw BadRecord{"\"" + list_key + "\" entries must be objects"};
    c.messages.push_back({normalized_role(string_field(turn, role_key, true), schema), string_field(turn, content_key, true)});
  }
  // Optional system first, then user/assistant alternating, ending with an assistant turn.
  const size_t first = !c.messages.empty() && c.messages[0].role == "system" ? 1 : 0;
  for (size_t i = first; i < c.messages.size(); ++i) {
    const char* expected = (i - first) % 2 == 0 ? "user" : "assistant";
    if (c.messages[i].role != expected) {
      throw BadRecord{"turn " + std::to_string(i) + " is " + c.messages[i].role + ", expected " + expected +
                      " (turns alternate user/assistant after an optional system)"};
    }
  }
  if (c.messages.size() == first || c.messages.back().role != "assistant") throw BadRecord{"must end with an assistant turn"};
  return c;
}

// A conversation's text is tokenized whole before cutoff_len cuts it, and BPE needs tens of
// bytes per byte of text: one 200 MB record would need gigabytes. No sample a trainer keeps
// comes near the bound.
void check_size(const Conversation& c) {
  size_t bytes = 0;
  for (const auto& m : c.messages) bytes += m.content.size();
  if (bytes > kMaxConversationBytes) {
    throw BadRecord{"its text is " + std::to_string(bytes) + " bytes; a record may hold at most " +
                    std::to_string(kMaxConversationBytes) + " (cutoff_len keeps far fewer tokens anyway)"};
  }
}

}  // namespace

DatasetFormat parse_dataset_format(const std::string& name) {
  if (name == "alpaca") return DatasetFormat::kAlpaca;
  if (name == "sharegpt") return DatasetFormat::kSharegpt;
  throw UserError("dataset format '" + name + "' is not one of: alpaca, sharegpt");
}

std::vector<Conversation> load_sft_file(const std::string& path, DatasetFormat format, const SftLoadOptions& options,
                                        SftLoadReport* report) {
  const std::string text = io::read_user_file(path, io::kMaxDatasetBytes, "dataset file");
  // (where, record text or parsed record) pairs.
  std::vector<std::pair<std::string, Json>> records;
  std::vector<std::pair<std::string, std::string>> unparsed;
  const bool jsonl = path.size() >= 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0;
  if (jsonl) {
    size_t start = 0, line = 0;
    while (start < text.size()) {
      size_t nl = text.find('\n', start);
      if (nl == std::string::npos) nl = text.size();
      ++line;
      std::string record = text.substr(start, nl - start);
      if (!record.empty() && record.back() == '\r') record.pop_back();
      if (record.find_first_not_of(" \t") != std::string::npos) unparsed.emplace_back(path + ":" + std::to_string(line), record);
      start = nl + 1;
    }
  } else {
    if (!io::json_nesting_within(text.data(), text.size(), io::kMaxUserJsonDepth)) {
      throw UserError(path + " nests JSON deeper than " + std::to_string(io::kMaxUserJsonDepth) + " levels");
    }
    Json all;
    try {
      all = Json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw UserError(path + " is not valid JSON (" + e.what() + "); a .json dataset is one array of records");
    }
    if (!all.is_array()) throw UserError(path + " must hold a JSON array of records (or use .jsonl, one record per line)");
    for (size_t k = 0; k < all.size(); ++k) records.emplace_back(path + "[#" + std::to_string(k) + "]", all[k]);
  }
  std::vector<Conversation> out;
  const auto handle_bad = [&](const std::string& where, const std::string& what) {
    const std::string message = where + ": " + what;
    if (options.on_bad_record == BadRecordPolicy::kStop) {
      throw UserError(message + " (set the bad-record policy to skip to leave such records out)");
    }
    if (report) report->skipped.push_back(message);
  };
  const auto take = [&](const std::string& where, const Json& record) {
    try {
      if (!record.is_object()) throw BadRecord{"a record must be a JSON object"};
      Conversation c = format == DatasetFormat::kAlpaca ? from_alpaca(record, options.schema) : from_sharegpt(record, options.schema);
      check_size(c);
      c.source = where;
      out.push_back(std::move(c));
    } catch (const BadRecord& bad) {
      handle_bad(where, bad.what);
    }
  };
  for (const auto& [where, record_text] : unparsed) {
    if (options.max_samples && static_cast<int64_t>(out.size()) >= *options.max_samples) break;
    if (!io::json_nesting_within(record_text.data(), record_text.size(), io::kMaxUserJsonDepth)) {
      handle_bad(where, "nests JSON deeper than " + std::to_string(io::kMaxUserJsonDepth) + " levels");
      continue;
    }
    Json record;
    try {
      record = Json::parse(record_text);
    } catch (const nlohmann::json::exception& e) {
      handle_bad(where, std::string("not valid JSON (") + e.what() + ")");
      continue;
    }
    take(where, record);
  }
  for (const auto& [where, record] : records) {
    if (options.max_samples && static_cast<int64_t>(out.size()) >= *options.max_samples) break;
    take(where, record);
  }
  return out;
}

}  // namespace hyperparallel::data
