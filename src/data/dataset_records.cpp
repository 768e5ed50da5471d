// Reading a dataset file record by record. See dataset_records.h.
#include "dataset_records.h"

#include <vector>

#include "hyperparallel/io/user_files.h"
#include "hyperparallel/platform/user_error.h"
#include "utf8.h"

namespace hyperparallel::data {
namespace {

using Json = nlohmann::ordered_json;

// Applies the policy to records and counts the accepted ones.
class RecordGate {
 public:
  RecordGate(const SftLoadOptions& options, SftLoadReport* report) : options_(options), report_(report) {}

  bool full() const { return options_.max_samples && taken_ >= *options_.max_samples; }

  // Runs `take`; a BadRecord it throws goes by the policy.
  template <typename F>
  void offer(const std::string& where, F&& take) {
    try {
      take();
      ++taken_;
    } catch (const BadRecord& bad) {
      bad_record(where, bad.what);
    }
  }

  void bad_record(const std::string& where, const std::string& what) {
    const std::string message = where + ": " + what;
    if (options_.on_bad_record == BadRecordPolicy::kStop) {
      throw UserError(message + " (set the bad-record policy to skip to leave such records out)");
    }
    if (report_) report_->skipped.push_back(message);
  }

 private:
  const SftLoadOptions& options_;
  SftLoadReport* report_;
  int64_t taken_ = 0;
};

std::string nesting_message() { return "nests JSON deeper than " + std::to_string(io::kMaxUserJsonDepth) + " levels"; }

}  // namespace

bool has_suffix(const std::string& path, const std::string& suffix) {
  return path.size() >= suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string record_string(const Json& record, const std::string& key, bool required) {
  if (key.empty() || !record.contains(key) || record[key].is_null()) {
    if (required) throw BadRecord{"missing \"" + key + "\""};
    return "";
  }
  if (!record[key].is_string()) throw BadRecord{"\"" + key + "\" must be a string"};
  return record[key].get<std::string>();
}

void check_record_bytes(size_t bytes) {
  if (bytes > kMaxConversationBytes) {
    throw BadRecord{"its text is " + std::to_string(bytes) + " bytes; a record may hold at most " +
                    std::to_string(kMaxConversationBytes) + " (cutoff_len keeps far fewer tokens anyway)"};
  }
}

void for_each_json_record(const std::string& path, const SftLoadOptions& options, SftLoadReport* report,
                          const JsonRecordTaker& take) {
  const std::string text = io::read_user_file(path, io::kMaxDatasetBytes, "dataset file");
  RecordGate gate(options, report);
  const auto offer = [&](const std::string& where, const Json& record) {
    gate.offer(where, [&] {
      if (!record.is_object()) throw BadRecord{"a record must be a JSON object"};
      take(where, record);
    });
  };
  if (has_suffix(path, ".jsonl")) {
    size_t start = 0, line = 0;
    while (start < text.size() && !gate.full()) {
      size_t nl = text.find('\n', start);
      if (nl == std::string::npos) nl = text.size();
      ++line;
      std::string record_text = text.substr(start, nl - start);
      start = nl + 1;
      if (!record_text.empty() && record_text.back() == '\r') record_text.pop_back();
      if (record_text.find_first_not_of(" \t") == std::string::npos) continue;
      const std::string where = path + ":" + std::to_string(line);
      if (!io::json_nesting_within(record_text.data(), record_text.size(), io::kMaxUserJsonDepth)) {
        gate.bad_record(where, nesting_message());
        continue;
      }
      Json record;
      try {
        record = Json::parse(record_text);
      } catch (const nlohmann::json::exception& e) {
        gate.bad_record(where, std::string("not valid JSON (") + e.what() + ")");
        continue;
      }
      offer(where, record);
    }
    return;
  }
  if (!io::json_nesting_within(text.data(), text.size(), io::kMaxUserJsonDepth)) throw UserError(path + " " + nesting_message());
  Json all;
  try {
    all = Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path + " is not valid JSON (" + e.what() + "); a .json dataset is one array of records");
  }
  if (!all.is_array()) throw UserError(path + " must hold a JSON array of records (or use .jsonl, one record per line)");
  for (size_t k = 0; k < all.size() && !gate.full(); ++k) offer(path + "[#" + std::to_string(k) + "]", all[k]);
}

void for_each_text_line(const std::string& path, const SftLoadOptions& options, SftLoadReport* report,
                        const TextLineTaker& take) {
  const std::string text = io::read_user_file(path, io::kMaxDatasetBytes, "dataset file");
  RecordGate gate(options, report);
  size_t start = 0, line = 0;
  while (start < text.size() && !gate.full()) {
    const size_t end = std::min(text.find_first_of("\r\n", start), text.size());
    ++line;
    std::string record = text.substr(start, end - start);
    start = end + (text.compare(end, 2, "\r\n") == 0 ? 2 : 1);
    gate.offer(path + ":" + std::to_string(line), [&] {
      check_record_bytes(record.size());
      const size_t bad = utf8_first_invalid(record);
      if (bad != std::string::npos) throw BadRecord{"not valid UTF-8 (at byte " + std::to_string(bad + 1) + " of the line)"};
      take(path + ":" + std::to_string(line), std::move(record));
    });
  }
}

}  // namespace hyperparallel::data
