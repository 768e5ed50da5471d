// Reading alpaca / sharegpt records. See data/sft_dataset.h.
#include "hyperparallel/data/sft_dataset.h"

#include "dataset_records.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::data {
namespace {

using Json = nlohmann::json;

Conversation from_alpaca(const Json& r, const DatasetSchema& schema) {
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
  const std::string system = record_string(r, schema.system, false);
  if (!system.empty()) c.messages.push_back({"system", system});
  for (const auto& turn : r[list_key]) {
    if (!turn.is_object()) throw BadRecord{"\"" + list_key + "\" entries must be objects"};
    c.messages.push_back({normalized_role(record_string(turn, role_key, true), schema), record_string(turn, content_key, true)});
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

size_t text_bytes(const Conversation& c) {
  size_t bytes = 0;
  for (const auto& m : c.messages) bytes += m.content.size();
  return bytes;
}

}  // namespace

DatasetFormat parse_dataset_format(const std::string& name) {
  if (name == "alpaca") return DatasetFormat::kAlpaca;
  if (name == "sharegpt") return DatasetFormat::kSharegpt;
  throw UserError("dataset format '" + name + "' is not one of: alpaca, sharegpt");
}

std::vector<Conversation> load_sft_file(const std::string& path, DatasetFormat format, const SftLoadOptions& options,
                                        SftLoadReport* report) {
  if (has_suffix(path, ".txt")) {
    throw UserError(path + " is a plain-text file (one text per line), which trains with stage: pt; SFT reads alpaca or "
                    "sharegpt records from .json / .jsonl files");
  }
  std::vector<Conversation> out;
  for_each_json_record(path, options, report, [&](const std::string& where, const Json& record) {
    Conversation c = format == DatasetFormat::kAlpaca ? from_alpaca(record, options.schema) : from_sharegpt(record, options.schema);
    check_record_bytes(text_bytes(c));
    c.source = where;
    out.push_back(std::move(c));
  });
  return out;
}

}  // namespace hyperparallel::data
