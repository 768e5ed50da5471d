// Pretraining texts from .txt / .json / .jsonl files. See data/pretrain_dataset.h.
#include "hyperparallel/data/pretrain_dataset.h"

#include "dataset_records.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::data {
namespace {

using Json = nlohmann::ordered_json;

// LlamaFactory's AlpacaDatasetConverter: the user turn is the non-empty ones of prompt and
// query joined by "\n"; pretraining reads that turn only.
std::string alpaca_text(const Json& record, const DatasetSchema& schema) {
  const std::string prompt = record_string(record, schema.prompt, true);
  const std::string query = record_string(record, schema.query, false);
  if (prompt.empty()) return query;
  return query.empty() ? prompt : prompt + "\n" + query;
}

}  // namespace

std::vector<TextSample> load_text_file(const std::string& path, DatasetFormat format, const SftLoadOptions& options,
                                       SftLoadReport* report) {
  std::vector<TextSample> out;
  if (has_suffix(path, ".txt")) {
    for_each_text_line(path, options, report, [&](const std::string& where, std::string line) {
      out.push_back({std::move(line), where});
    });
    return out;
  }
  if (!has_suffix(path, ".json") && !has_suffix(path, ".jsonl")) {
    throw UserError(path + ": pretraining texts are read from .txt (one text per line), .json or .jsonl files; rename it or "
                    "convert it to one of these");
  }
  if (format != DatasetFormat::kAlpaca) {
    // The conversation's own checks (roles, order) apply; its first turn after the system
    // prompt is the text (a user turn, or an observation, which may open a conversation), as
    // LlamaFactory's pretrain processor reads _prompt[0].
    for (Conversation& c : load_sft_file(path, format, options, report)) {
      for (ChatMessage& m : c.messages) {
        if (m.role != "system") {
          out.push_back({std::move(m.content), c.source});
          break;
        }
      }
    }
    return out;
  }
  for_each_json_record(path, options, report, [&](const std::string& where, const Json& record) {
    std::string text = alpaca_text(record, options.schema);
    check_record_bytes(text.size());
    out.push_back({std::move(text), where});
  });
  return out;
}

}  // namespace hyperparallel::data
