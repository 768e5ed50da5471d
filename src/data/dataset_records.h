// The records of one dataset file, one at a time, under the bad-record policy: the part that
// SFT conversations (sft_dataset.cpp) and pretraining texts (pretrain_dataset.cpp) share.
//
//   .jsonl  one JSON record per line; blank lines are not records; `where` is "file:line"
//   .json   one JSON array of records; `where` is "file[#index]"
//   .txt    every line is a record, blank ones included, as Hugging Face's "text" loader reads
//           it: "\n", "\r\n" and a lone "\r" end a line (Python's universal newlines), the
//           break itself is not part of the text, and a final break does not start a record;
//           each line must be UTF-8; `where` is "file:line"
//
// Records are nlohmann::ordered_json: object keys keep the file's order, which tool calls
// written back as JSON (data/tool_calls.h) depend on.
//
// `take` turns one record into a sample or throws BadRecord saying what is wrong; the reader
// then stops with a UserError naming `where` (kStop) or lists it in the report and goes on
// (kSkip). Reading stops once `take` has accepted max_samples records. The whole file is read
// through io::read_user_file (a regular file, at most io::kMaxDatasetBytes).
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>

#include "hyperparallel/data/sft_dataset.h"

namespace hyperparallel::data {

// A record that cannot become a sample; the message says what is wrong.
struct BadRecord {
  std::string what;
};

// record[key] as a string; "" when the key is empty, absent or null, unless `required`
// (then BadRecord). A value of another type is a BadRecord.
std::string record_string(const nlohmann::ordered_json& record, const std::string& key, bool required);

// A sample's text beyond kMaxConversationBytes is a BadRecord (it is tokenized whole before
// cutoff_len cuts it, and BPE needs tens of bytes per byte of text).
void check_record_bytes(size_t bytes);

using JsonRecordTaker = std::function<void(const std::string& where, const nlohmann::ordered_json& record)>;
using TextLineTaker = std::function<void(const std::string& where, std::string line)>;

// Each record of a .json or .jsonl file (by its name's ending: .jsonl, anything else .json).
void for_each_json_record(const std::string& path, const SftLoadOptions& options, SftLoadReport* report,
                          const JsonRecordTaker& take);

// Each line of a .txt file.
void for_each_text_line(const std::string& path, const SftLoadOptions& options, SftLoadReport* report,
                        const TextLineTaker& take);

// One record as a conversation in `format` (kAuto: sharegpt when has_turns, else alpaca), or
// BadRecord; sft_dataset.cpp's converters.
bool has_turns(const nlohmann::ordered_json& record, const DatasetSchema& schema);
Conversation read_conversation(const nlohmann::ordered_json& record, DatasetFormat format, const SftLoadOptions& options);

// Whether `path` ends with `suffix` (".txt", ".jsonl").
bool has_suffix(const std::string& path, const std::string& suffix);

}  // namespace hyperparallel::data
