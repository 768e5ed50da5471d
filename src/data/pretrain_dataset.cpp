// Pretraining texts from .txt / .json / .jsonl files. See data/pretrain_dataset.h.
#include "hyperparallel/data/pretrain_dataset.h"

#include "dataset_records.h"
#include "python_json.h"
#include "hyperparallel/platform/suggest.h"
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

// A text_template split into literal text and {field} names, as Python's str.format_map
// parses it; anything but a plain field name ({0}, {a.b}, {a[0]}, {a!r}, {a:>5}) is refused.
struct TemplatePiece {
  std::string text;
  bool field = false;
};

std::vector<TemplatePiece> parse_text_template(const std::string& t) {
  const auto bad = [&](const std::string& why) -> UserError {
    return UserError("text_template " + excerpt(t) + ": " + why +
                     "; write {field} for a record's field and {{ or }} for a brace");
  };
  std::vector<TemplatePiece> pieces(1);
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '}') {
      if (i + 1 < t.size() && t[i + 1] == '}') {
        pieces.back().text += '}';
        ++i;
        continue;
      }
      throw bad("a single '}'");
    }
    if (t[i] != '{') {
      pieces.back().text += t[i];
      continue;
    }
    if (i + 1 < t.size() && t[i + 1] == '{') {
      pieces.back().text += '{';
      ++i;
      continue;
    }
    const size_t close = t.find('}', i);
    if (close == std::string::npos) throw bad("a '{' without its '}'");
    const std::string name = t.substr(i + 1, close - i - 1);
    if (name.empty() || name.find_first_of(".[]!:{") != std::string::npos || name.find_first_not_of("0123456789") == std::string::npos) {
      throw bad("{" + name + "} is not a field name");
    }
    pieces.push_back({name, true});
    pieces.emplace_back();
    i = close;
  }
  return pieces;
}

// A field's text as str() writes it: strings as they are, numbers and booleans as Python
// prints them, null as None; lists and objects are bad records.
std::string template_value(const Json& record, const std::string& field) {
  if (!record.is_object()) throw BadRecord{"is not a JSON object"};
  if (!record.contains(field)) throw BadRecord{"has no field \"" + field + "\" (text_template)"};
  const Json& v = record[field];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  if (v.is_number()) return python_json_dumps(v);
  throw BadRecord{"field \"" + field + "\" is a " + std::string(v.is_array() ? "list" : "object") +
                  "; text_template places strings, numbers and booleans"};
}

std::string render_text_template(const std::vector<TemplatePiece>& pieces, const Json& record) {
  std::string out;
  for (const auto& p : pieces) out += p.field ? template_value(record, p.text) : p.text;
  return out;
}

}  // namespace

std::vector<TextSample> load_text_file(const std::string& path, DatasetFormat format, const SftLoadOptions& options,
                                       SftLoadReport* report) {
  std::vector<TextSample> out;
  if (has_suffix(path, ".txt")) {
    if (!options.schema.text_template.empty()) {
      throw UserError(path + " is plain text (one text per line), and text_template renders the fields of JSON records; "
                      "remove text_template or give a .jsonl file");
    }
    for_each_text_line(path, options, report, [&](const std::string& where, std::string line) {
      out.push_back({std::move(line), where});
    });
    return out;
  }
  if (!has_suffix(path, ".json") && !has_suffix(path, ".jsonl")) {
    throw UserError(path + ": pretraining texts are read from .txt (one text per line), .json or .jsonl files; rename it or "
                    "convert it to one of these");
  }
  const std::vector<TemplatePiece> pieces =
      options.schema.text_template.empty() ? std::vector<TemplatePiece>{} : parse_text_template(options.schema.text_template);
  for_each_json_record(path, options, report, [&](const std::string& where, const Json& record) {
    std::string text;
    if (!pieces.empty()) {
      text = render_text_template(pieces, record);
    } else if (format == DatasetFormat::kAlpaca || (format == DatasetFormat::kAuto && !has_turns(record, options.schema))) {
      text = alpaca_text(record, options.schema);
    } else {
      // The conversation's own checks (roles, order) apply; its first turn after the system
      // prompt is the text (a user turn, or an observation, which may open a conversation), as
      // LlamaFactory's pretrain processor reads _prompt[0].
      Conversation c = read_conversation(record, format, options);
      for (ChatMessage& m : c.messages) {
        if (m.role != "system") {
          text = std::move(m.content);
          break;
        }
      }
    }
    check_record_bytes(text.size());
    out.push_back({std::move(text), where});
  });
  return out;
}

}  // namespace hyperparallel::data
