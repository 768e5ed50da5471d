// SFT dataset files in LlamaFactory's formats, read into conversations.
//
//   alpaca    {"instruction", "input"?, "output", "system"?, "history"?: [[user, assistant], ...]}
//             -> [system], history turns, user = instruction (+ "\n" + input), assistant = output
//   sharegpt  {"conversations": [{"from": human|gpt|function_call|observation|system, "value"}],
//             "system"?, "tools"?} or {"messages": [{"role": user|assistant|..., "content"}]}:
//             LlamaFactory's SharegptDatasetConverter. A first system turn is the system
//             prompt (over the system column); then turns alternate human|observation /
//             gpt|function_call, an even number of them (so the last is gpt or function_call)
//   openai    {"messages": [{"role", "content", "tool_calls"?}], "tools"?}: LlamaFactory's
//             OpenAIDatasetConverter: an assistant message with "tool_calls" becomes a
//             function call (the JSON list of their "function" objects), consecutive "tool"
//             messages one observation joined by "\n</tool_response>\n<tool_response>\n" (tool
//             messages after the last other turn are dropped, as there), tools given as a
//             list are written as JSON, and the system prompt gets LlamaFactory's rule for this
//             converter: "detailed thinking off" when there are no tools (appended after
//             "\n" to a system prompt that does not say "detailed thinking on/off"), a "\n"
//             appended to it when there are
// Tool conversations (roles function / observation; a tools column in any of the formats):
// tools are read only from the column DatasetSchema::tools names (LlamaFactory's
// `columns.tools`), as the JSON text of a list (a string holding it, or the list itself);
// function-call turns and tools must parse as data/tool_calls.h says, and with
// SftLoadOptions::tool_format set must render in that format too — else the record is bad,
// named file:line.
// Files are .jsonl (one record per line) or .json (one array of records); a .txt file is
// refused with the fix (plain text is pretraining: data/pretrain_dataset.h). Every malformed
// record is reported as `file:line` (or `file[#index]` for .json) and what is wrong; the
// policy stops at the first (UserError) or skips it and lists it in the report — never
// silently. max_samples keeps the first N good records. Column and role names can be renamed
// as dataset_info.json's "columns" and "tags" do (DatasetSchema).
// kAuto (a dataset file named by its path, data/dataset_registry.h) reads each record as
// sharegpt when it has the turns column (DatasetSchema::messages, else "conversations" or
// "messages"), else as alpaca.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hyperparallel/data/chat_template.h"

namespace hyperparallel::data {

enum class DatasetFormat { kAlpaca, kSharegpt, kOpenai, kAuto };
enum class BadRecordPolicy { kStop, kSkip };

// Field and role names (LlamaFactory's dataset_info.json "columns" and "tags").
struct DatasetSchema {
  // alpaca
  std::string prompt = "instruction", query = "input", response = "output", history = "history";
  // pretraining (stage pt) only: each record rendered by this template instead of its prompt
  // column, as Python's str.format_map: "{field}" is the record's field, "{{" and "}}" braces
  std::string text_template = {};
  // all
  std::string system = "system";
  std::string tools;  // the tools column; empty: none is read (LlamaFactory's default)
  // sharegpt / openai. Empty: "conversations" with from/value or "messages" with role/content,
  // whichever the record has, and roles human|user, gpt|assistant, system,
  // observation|tool, function_call. With any tag set, roles are exactly the tagged names.
  std::string messages, role_tag, content_tag, user_tag, assistant_tag, system_tag, observation_tag, function_tag;
};

struct SftLoadOptions {
  std::optional<int64_t> max_samples;
  BadRecordPolicy on_bad_record = BadRecordPolicy::kStop;
  DatasetSchema schema;
  // The tool format the conversations will be rendered in (ChatTemplate::tool_format()); when
  // set, tools and function calls it cannot write are bad records. "": the checks every format needs.
  std::string tool_format = {};
};

// The most text one record may hold (all its messages); a longer one is a bad record.
inline constexpr size_t kMaxConversationBytes = size_t{16} << 20;

struct Conversation {
  std::vector<ChatMessage> messages;
  std::string source;  // file:line
  std::string tools = {};  // JSON text of the tool list (ChatRenderOptions::tools); "" for none
};

struct SftLoadReport {
  std::vector<std::string> skipped;  // "file:line: what is wrong"
};

DatasetFormat parse_dataset_format(const std::string& name);  // "alpaca" | "sharegpt" | "openai"
std::vector<Conversation> load_sft_file(const std::string& path, DatasetFormat format, const SftLoadOptions& options = {},
                                        SftLoadReport* report = nullptr);

}  // namespace hyperparallel::data
