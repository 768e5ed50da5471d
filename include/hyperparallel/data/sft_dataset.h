// SFT dataset files in LlamaFactory's formats, read into conversations.
//
//   alpaca    {"instruction", "input"?, "output", "system"?, "history"?: [[user, assistant], ...]}
//             -> [system], history turns, user = instruction (+ "\n" + input), assistant = output
//   sharegpt  {"conversations": [{"from": human|gpt|system, "value"}], "system"?} or
//             {"messages": [{"role": user|assistant|system, "content"}]}
//             turns must alternate user/assistant after an optional system, ending with assistant
// Files are .jsonl (one record per line) or .json (one array of records); a .txt file is
// refused with the fix (plain text is pretraining: data/pretrain_dataset.h). Every malformed
// record is reported as `file:line` (or `file[#index]` for .json) and what is wrong; the
// policy stops at the first (UserError) or skips it and lists it in the report — never
// silently. max_samples keeps the first N good records. Column and role names can be renamed
// as dataset_info.json's "columns" and "tags" do (DatasetSchema).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hyperparallel/data/chat_template.h"

namespace hyperparallel::data {

enum class DatasetFormat { kAlpaca, kSharegpt };
enum class BadRecordPolicy { kStop, kSkip };

// Field and role names (LlamaFactory's dataset_info.json "columns" and "tags").
struct DatasetSchema {
  // alpaca
  std::string prompt = "instruction", query = "input", response = "output", history = "history";
  // both
  std::string system = "system";
  // sharegpt. Empty: "conversations" with from/value or "messages" with role/content, whichever
  // the record has, and roles human|user, gpt|assistant, system.
  std::string messages, role_tag, content_tag, user_tag, assistant_tag, system_tag;
};

struct SftLoadOptions {
  std::optional<int64_t> max_samples;
  BadRecordPolicy on_bad_record = BadRecordPolicy::kStop;
  DatasetSchema schema;
};

// The most text one record may hold (all its messages); a longer one is a bad record.
inline constexpr size_t kMaxConversationBytes = size_t{16} << 20;

struct Conversation {
  std::vector<ChatMessage> messages;
  std::string source;  // file:line
};

struct SftLoadReport {
  std::vector<std::string> skipped;  // "file:line: what is wrong"
};

DatasetFormat parse_dataset_format(const std::string& name);  // "alpaca" | "sharegpt"
std::vector<Conversation> load_sft_file(const std::string& path, DatasetFormat format, const SftLoadOptions& options = {},
                                        SftLoadReport* report = nullptr);

}  // namespace hyperparallel::data
