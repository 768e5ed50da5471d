// dataset_info.json and dataset mixing. See data/dataset_registry.h.
#include "hyperparallel/data/dataset_registry.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "hyperparallel/data/pretrain_dataset.h"
#include "hyperparallel/data/synthetic_sft.h"
#include "hyperparallel/io/user_files.h"
#include "hyperparallel/platform/suggest.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::data {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::vector<std::string> split_names(const std::string& names) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= names.size()) {
    size_t comma = names.find(',', start);
    if (comma == std::string::npos) comma = names.size();
    std::string name = names.substr(start, comma - start);
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    if (name.empty()) throw UserError("dataset '" + names + "' has an empty name in its comma-separated list");
    out.push_back(name);
    start = comma + 1;
  }
  return out;
}

Json read_dataset_info(const fs::path& path) {
  if (!fs::exists(path)) return Json();
  Json info = io::read_user_json(path.string(), io::kMaxSmallJsonBytes, "dataset_info.json");
  if (!info.is_object()) throw UserError(path.string() + " must be a JSON object of dataset name -> entry");
  return info;
}

// Copies string fields of `section` into the schema, refusing unknown ones.
void read_names(const Json& entry, const char* section, const std::vector<std::pair<std::string, std::string*>>& fields,
                const std::string& where) {
  if (!entry.contains(section)) return;
  const Json& s = entry[section];
  if (!s.is_object()) throw UserError(where + ": \"" + section + "\" must be an object");
  std::vector<std::string> known;
  for (const auto& f : fields) known.push_back(f.first);
  for (auto it = s.begin(); it != s.end(); ++it) {
    auto f = std::find_if(fields.begin(), fields.end(), [&](const auto& x) { return x.first == it.key(); });
    if (f == fields.end()) {
      throw UserError(where + ": \"" + section + "\" has unknown field \"" + it.key() + "\"" + did_you_mean(it.key(), known) +
                      "; known: " + join_names(known));
    }
    if (!it.value().is_string()) throw UserError(where + ": \"" + section + "." + it.key() + "\" must be a string");
    *f->second = it.value().get<std::string>();
  }
}

// Which stage reads the entry: SFT conversations or pretraining texts.
enum class Reader { kSft, kPretrain };

std::vector<std::string> dataset_files(const fs::path& path, const std::string& where, Reader reader) {
  if (fs::is_directory(path)) {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(path)) {
      const std::string ext = e.path().extension().string();
      if (e.is_regular_file() && (ext == ".json" || ext == ".jsonl" || (reader == Reader::kPretrain && ext == ".txt"))) {
        files.push_back(e.path().string());
      }
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) {
      throw UserError(where + ": folder " + path.string() + " has no " +
                      (reader == Reader::kPretrain ? ".txt, .json or .jsonl" : ".json or .jsonl") + " files");
    }
    return files;
  }
  if (!fs::exists(path)) throw UserError(where + ": file " + path.string() + " does not exist");
  return {path.string()};
}

// An entry of dataset_info.json, checked: its files and how to read them.
struct ResolvedEntry {
  std::string where;
  DatasetFormat format = DatasetFormat::kAlpaca;
  SftLoadOptions options;
  std::vector<std::string> files;
};

ResolvedEntry resolve_entry(const std::string& name, const Json& entry, const fs::path& dir, const SftLoadOptions& base, Reader reader) {
  ResolvedEntry out;
  out.where = (dir / "dataset_info.json").string() + " entry \"" + name + "\"";
  const std::string& where = out.where;
  if (!entry.is_object()) throw UserError(where + " must be an object");
  for (const char* remote : {"hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name"}) {
    if (entry.contains(remote)) {
      throw UserError(where + " uses \"" + remote + "\"; nothing is downloaded here: put the data in a local file and name it with \"file_name\"");
    }
  }
  static const std::vector<std::string> kKnown = {"file_name", "formatting", "columns", "tags", "ranking", "split", "subset",
                                                  "folder", "num_samples", "load_from"};
  for (auto it = entry.begin(); it != entry.end(); ++it) {
    if (std::find(kKnown.begin(), kKnown.end(), it.key()) == kKnown.end()) {
      throw UserError(where + " has unknown field \"" + it.key() + "\"" + did_you_mean(it.key(), kKnown));
    }
  }
  if (entry.value("ranking", false)) {
    throw UserError(where + " is a ranking (preference) dataset; only " +
                    (reader == Reader::kPretrain ? "plain-text (stage pt)" : "SFT") + " datasets are supported");
  }
  if (!entry.contains("file_name") || !entry["file_name"].is_string()) throw UserError(where + " needs \"file_name\" (a string)");
  const std::string formatting = entry.value("formatting", std::string("alpaca"));
  try {
    out.format = parse_dataset_format(formatting);
  } catch (const UserError& e) {
    throw UserError(where + ": " + e.what());
  }
  out.options = base;
  DatasetSchema& s = out.options.schema;
  read_names(entry, "columns",
             {{"prompt", &s.prompt}, {"query", &s.query}, {"response", &s.response}, {"history", &s.history},
              {"system", &s.system}, {"messages", &s.messages}, {"tools", &s.tools}},
             where);
  read_names(entry, "tags",
             {{"role_tag", &s.role_tag}, {"content_tag", &s.content_tag}, {"user_tag", &s.user_tag},
              {"assistant_tag", &s.assistant_tag}, {"system_tag", &s.system_tag}, {"observation_tag", &s.observation_tag},
              {"function_tag", &s.function_tag}},
             where);
  // Once an entry names any tag, the others take LlamaFactory's defaults.
  if (entry.contains("tags")) {
    const std::vector<std::pair<std::string*, const char*>> defaults = {
        {&s.messages, "conversations"}, {&s.role_tag, "from"},      {&s.content_tag, "value"},
        {&s.user_tag, "human"},         {&s.assistant_tag, "gpt"},   {&s.system_tag, "system"},
        {&s.observation_tag, "observation"}, {&s.function_tag, "function_call"}};
    for (const auto& [field, value] : defaults) {
      if (field->empty()) *field = value;
    }
  }
  const bool columns = entry.contains("columns");
  // LlamaFactory's DatasetAttr: with "columns" given, a column it does not name is unset, so
  // {"prompt": "text"} reads no "input" column.
  if (reader == Reader::kPretrain && columns && !entry["columns"].contains("query")) s.query.clear();
  out.files = dataset_files(dir / entry["file_name"].get<std::string>(), where, reader);
  if (reader == Reader::kPretrain && columns && entry["columns"].contains("prompt") && s.prompt != "text") {
    for (const auto& file : out.files) {
      if (fs::path(file).extension() == ".txt") {
        throw UserError(where + ": " + file + " is plain text, whose one column is \"text\", but \"columns\" names \"" + s.prompt +
                        "\" as the prompt; set \"columns\": {\"prompt\": \"text\"}");
      }
    }
  }
  return out;
}

// The entry's files in order, max_samples counted over the whole entry.
template <typename Sample, typename LoadFile>
std::vector<Sample> load_files(const ResolvedEntry& entry, SftLoadReport* report, const LoadFile& load_file) {
  std::vector<Sample> out;
  for (const auto& file : entry.files) {
    if (entry.options.max_samples && static_cast<int64_t>(out.size()) >= *entry.options.max_samples) break;
    SftLoadOptions per_file = entry.options;
    if (entry.options.max_samples) per_file.max_samples = *entry.options.max_samples - static_cast<int64_t>(out.size());
    auto part = load_file(file, entry.format, per_file, report);
    out.insert(out.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  return out;
}

// A DatasetFile as a resolved entry: its schema overrides, no default role names.
ResolvedEntry resolve_file(const DatasetFile& file, const SftLoadOptions& base, Reader reader) {
  ResolvedEntry out;
  out.where = "dataset_file.path";
  out.format = DatasetFormat::kAuto;
  if (file.formatting != "auto") {
    try {
      out.format = parse_dataset_format(file.formatting);
    } catch (const UserError& e) {
      throw UserError("dataset_file.formatting: " + std::string(e.what()) + " or auto");
    }
  }
  out.options = base;
  DatasetSchema& s = out.options.schema;
  s.role_tag = file.role_tag;
  s.content_tag = file.content_tag;
  if (reader == Reader::kPretrain && (out.format == DatasetFormat::kAlpaca || out.format == DatasetFormat::kAuto)) {
    s.prompt = file.column.empty() ? "text" : file.column;  // the text, alone (its query column unset)
    s.query.clear();
  } else {
    s.messages = file.column;
  }
  if (reader == Reader::kPretrain) s.text_template = file.text_template;
  out.files = dataset_files(fs::path(file.path), out.where, reader);
  return out;
}

[[noreturn]] void unknown_dataset(const std::string& name, const Json& info, const fs::path& info_path) {
  std::vector<std::string> known = synthetic_dataset_names();
  if (info.is_object()) {
    for (auto it = info.begin(); it != info.end(); ++it) known.push_back(it.key());
  }
  throw UserError("dataset '" + name + "' is neither built in nor in " + info_path.string() +
                  (info.is_object() ? "" : " (which does not exist; set dataset_dir)") + did_you_mean(name, known) +
                  "; known: " + join_names(known));
}

}  // namespace

std::vector<Conversation> load_datasets(const std::string& names, const std::string& dataset_dir,
                                        const SftLoadOptions& options, SftLoadReport* report) {
  const fs::path dir(dataset_dir);
  const fs::path info_path = dir / "dataset_info.json";
  const Json info = read_dataset_info(info_path);
  std::vector<Conversation> all;
  for (const std::string& name : split_names(names)) {
    std::vector<Conversation> part;
    if (info.is_object() && info.contains(name)) {
      part = load_files<Conversation>(resolve_entry(name, info[name], dir, options, Reader::kSft), report,
                                      [](const std::string& file, DatasetFormat format, const SftLoadOptions& o, SftLoadReport* r) {
                                        return load_sft_file(file, format, o, r);
                                      });
    } else if (is_synthetic_dataset(name)) {
      part = make_synthetic_dataset(name, options.max_samples.value_or(4000), 0).train;
    } else {
      unknown_dataset(name, info, info_path);
    }
    all.insert(all.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  return all;
}

std::vector<TextSample> load_text_datasets(const std::string& names, const std::string& dataset_dir,
                                           const SftLoadOptions& options, SftLoadReport* report) {
  const fs::path dir(dataset_dir);
  const fs::path info_path = dir / "dataset_info.json";
  const Json info = read_dataset_info(info_path);
  std::vector<TextSample> all;
  for (const std::string& name : split_names(names)) {
    if (!(info.is_object() && info.contains(name))) {
      if (is_synthetic_dataset(name)) {
        throw UserError("dataset '" + name + "' is a built-in chat dataset, and stage pt trains on plain text: name an entry of " +
                        info_path.string() + " whose file is .txt or has a text column (e.g. {\"file_name\": \"corpus.txt\", " +
                        "\"columns\": {\"prompt\": \"text\"}}), or use stage: sft");
      }
      unknown_dataset(name, info, info_path);
    }
    auto part = load_files<TextSample>(resolve_entry(name, info[name], dir, options, Reader::kPretrain), report,
                                       [](const std::string& file, DatasetFormat format, const SftLoadOptions& o, SftLoadReport* r) {
                                         return load_text_file(file, format, o, r);
                                       });
    all.insert(all.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  return all;
}

std::vector<Conversation> load_dataset_file(const DatasetFile& file, const SftLoadOptions& options, SftLoadReport* report) {
  return load_files<Conversation>(resolve_file(file, options, Reader::kSft), report,
                                  [](const std::string& path, DatasetFormat format, const SftLoadOptions& o, SftLoadReport* r) {
                                    return load_sft_file(path, format, o, r);
                                  });
}

std::vector<TextSample> load_text_dataset_file(const DatasetFile& file, const SftLoadOptions& options, SftLoadReport* report) {
  return load_files<TextSample>(resolve_file(file, options, Reader::kPretrain), report,
                                [](const std::string& path, DatasetFormat format, const SftLoadOptions& o, SftLoadReport* r) {
                                  return load_text_file(path, format, o, r);
                                });
}

std::vector<std::string> dataset_source_files(const std::string& names, const std::string& dataset_dir, const DatasetFile* file,
                                              bool text) {
  const Reader reader = text ? Reader::kPretrain : Reader::kSft;
  std::vector<std::string> files;
  if (!names.empty()) {
    const fs::path dir(dataset_dir);
    const fs::path info_path = dir / "dataset_info.json";
    const Json info = read_dataset_info(info_path);
    if (info.is_object()) files.push_back(info_path.string());
    for (const std::string& name : split_names(names)) {
      if (!(info.is_object() && info.contains(name))) continue;  // built in (or unknown: loading names it)
      const auto entry_files = resolve_entry(name, info[name], dir, {}, reader).files;
      files.insert(files.end(), entry_files.begin(), entry_files.end());
    }
  }
  if (file) {
    const auto file_files = resolve_file(*file, {}, reader).files;
    files.insert(files.end(), file_files.begin(), file_files.end());
  }
  return files;
}

}  // namespace hyperparallel::data
