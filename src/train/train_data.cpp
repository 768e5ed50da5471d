// The trainer's data pipeline. See train_data.h.
#include "train_data.h"

#include <malloc.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "hyperparallel/data/dataset_registry.h"
#include "hyperparallel/data/pretrain_samples.h"
#include "hyperparallel/models/model_config.h"
#include "hyperparallel/platform/user_error.h"
#include "tokenized_cache.h"

namespace hyperparallel::train {
namespace fs = std::filesystem;

std::string tokenizer_dir(const TrainConfig& config) {
  if (!config.tokenizer.empty()) return config.tokenizer;
  if (models::is_debug_flavour(config.model_name_or_path)) {
    throw UserError("model_name_or_path: " + config.model_name_or_path +
                    " is a built-in flavour without tokenizer files; set tokenizer: to a folder with tokenizer.json "
                    "(e.g. examples/tokenizer)");
  }
  return config.model_name_or_path;
}

data::ChatTemplate chat_template_for(const TrainConfig& config, const data::Tokenizer& tokenizer) {
  auto chat_template = data::ChatTemplate::named(config.chat_template, tokenizer.special_tokens().eos);
  if (config.default_system) chat_template = chat_template.with_default_system(*config.default_system);
  if (config.tool_format) chat_template = chat_template.with_tool_format(*config.tool_format);
  return chat_template;
}

namespace {

// What building rows reports, kept in the rows' meta so a cached run reports it too.
struct RowsReport {
  int64_t count = 0;  // conversations (sft) or texts (pt) read
  data::SftLoadReport load;
  data::SampleReport sample;
};

nlohmann::json report_json(const RowsReport& r, const nlohmann::json& settings) {
  return {{"settings", settings},
          {"count", r.count},
          {"skipped", r.load.skipped},
          {"truncated", r.sample.truncated},
          {"dropped", r.sample.dropped}};
}

// The report in `rows`' meta, added to `out`'s. UserError when the meta is not ours.
void add_report(const data::TokenRows& rows, const std::string& where, TrainData& out, int64_t* count) {
  try {
    const auto meta = nlohmann::json::parse(rows.meta());
    if (count) *count = meta.at("count").get<int64_t>();
    for (const auto& s : meta.at("skipped")) out.load_report.skipped.push_back(s.get<std::string>());
    out.sample_report.truncated += meta.at("truncated").get<int64_t>();
    for (const auto& d : meta.at("dropped")) out.sample_report.dropped.push_back(d.get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    throw UserError(where + ": its description of the rows is unreadable (" + e.what() + "); delete the file so it is made again");
  }
}

// `more` after `all`.
template <typename T>
void append(std::vector<T>& all, std::vector<T> more) {
  all.insert(all.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
}

// Labelled rows of the named datasets (and, with `file`, the dataset file after them), as
// the stage builds them (pt: text blocks; sft: templated conversations, packed when asked),
// tokenized on `threads` threads.
std::vector<data::TrainingRow> build_rows(const TrainConfig& config, const std::string& datasets, const data::DatasetFile* file,
                                          const data::Tokenizer& tokenizer, int threads, RowsReport& report) {
  data::SftLoadOptions load;
  load.max_samples = config.max_samples;
  load.on_bad_record = config.bad_records == "skip" ? data::BadRecordPolicy::kSkip : data::BadRecordPolicy::kStop;
  if (config.stage == "pt") {
    // LlamaFactory's pretraining: every token of plain texts. See docs/data.md "Pretraining text".
    std::vector<data::TextSample> texts;
    if (!datasets.empty()) texts = data::load_text_datasets(datasets, config.dataset_dir, load, &report.load);
    if (file) append(texts, data::load_text_dataset_file(*file, load, &report.load));
    report.count = static_cast<int64_t>(texts.size());
    data::PretrainOptions pretrain;
    pretrain.cutoff_len = config.cutoff_len;
    pretrain.packing = config.packing;
    pretrain.eos_token = data::pretrain_eos_token(tokenizer, config.chat_template);
    pretrain.bos_token = data::pretrain_bos_token(tokenizer);
    pretrain.threads = threads;
    return data::build_pretrain_rows(tokenizer, texts, pretrain, &report.sample);
  }
  // The template's tool format checks tool records as they load, so a bad one is named file:line.
  const data::ChatTemplate chat_template = chat_template_for(config, tokenizer);
  load.tool_format = chat_template.tool_format();
  std::vector<data::Conversation> conversations;
  if (!datasets.empty()) conversations = data::load_datasets(datasets, config.dataset_dir, load, &report.load);
  if (file) append(conversations, data::load_dataset_file(*file, load, &report.load));
  report.count = static_cast<int64_t>(conversations.size());
  data::SampleOptions sample;
  sample.cutoff_len = config.cutoff_len;
  sample.train_on_prompt = config.train_on_prompt;
  sample.mask_history = config.mask_history;
  sample.render.enable_thinking = config.enable_thinking;
  sample.threads = threads;
  auto rows = data::build_sft_rows(tokenizer, chat_template, conversations, sample, &report.sample);
  if (config.packing) rows = data::pack_rows(rows, config.cutoff_len);
  return rows;
}

// val_size rows drawn from `rows` by a seeded shuffle (a fraction below 1, else a count), as
// LlamaFactory splits the preprocessed dataset; the rest stay in order for training.
data::TokenRows split_validation(data::TokenRows& rows, double val_size, uint64_t seed) {
  const int64_t n = rows.size();
  const int64_t take = val_size < 1 ? static_cast<int64_t>(std::ceil(val_size * static_cast<double>(n))) : static_cast<int64_t>(val_size);
  if (take >= n) {
    throw UserError("val_size " + std::to_string(val_size) + " takes " + std::to_string(take) + " of the " + std::to_string(n) +
                    " training rows, leaving none to train on; use a smaller val_size (a fraction, or a count below " + std::to_string(n) + ")");
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  uint64_t state = seed ^ 0x9E3779B97F4A7C15ull;
  const auto next = [&state] {  // splitmix64
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[next() % static_cast<uint64_t>(i + 1)]);
  std::vector<bool> held(static_cast<size_t>(n), false);
  std::vector<int64_t> eval(order.begin(), order.begin() + take), train;
  for (int64_t i : eval) held[i] = true;
  for (int64_t i = 0; i < n; ++i) {
    if (!held[i]) train.push_back(i);
  }
  data::TokenRows eval_rows = rows.select(std::move(eval));
  rows = rows.select(std::move(train));
  return eval_rows;
}

// The tokenizer files the rows depend on.
std::vector<std::string> tokenizer_files(const std::string& dir_or_file) {
  const fs::path p(dir_or_file);
  const fs::path dir = fs::is_directory(p) ? p : p.parent_path();
  std::vector<std::string> files{(fs::is_directory(p) ? p / "tokenizer.json" : p).string()};
  if (fs::exists(dir / "tokenizer_config.json")) files.push_back((dir / "tokenizer_config.json").string());
  return files;
}

// One dataset's rows (the training data, or eval_dataset): from the cache, else tokenized
// (and cached); `folder` (tokenized_path) names the file `name`.hprows there instead.
data::TokenRows dataset_rows(const TrainConfig& config, const std::string& datasets, const data::DatasetFile* file,
                             const data::Tokenizer& tokenizer, const std::string& folder, const std::string& name,
                             std::chrono::system_clock::time_point started, TrainData& out, int64_t* count) {
  const nlohmann::json settings = rows_settings(config, datasets, file);
  const int threads = tokenizing_threads(config.preprocessing_num_workers);
  const auto tokenize = [&] {
    const auto begin = std::chrono::steady_clock::now();
    RowsReport report;
    const auto rows = build_rows(config, datasets, file, tokenizer, threads, report);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    char line[160];
    std::snprintf(line, sizeof line, "%s data: %lld %s tokenized in %.1f s on %d thread%s", name.c_str(),
                  static_cast<long long>(report.count), config.stage == "pt" ? "texts" : "conversations", seconds, threads,
                  threads == 1 ? "" : "s");
    out.notes.push_back(line);
    return data::TokenRows::from_rows(rows, report_json(report, settings).dump());
  };
  std::string path;
  const std::string cache = tokenized_cache_dir(config.tokenized_cache_dir);
  if (!folder.empty()) {
    path = (fs::path(folder) / (name + ".hprows")).string();
  } else if (!cache.empty()) {
    std::error_code ec;
    fs::create_directories(cache, ec);
    if (ec || ::access(cache.c_str(), W_OK) != 0) {
      out.notes.push_back("tokenized_cache_dir " + cache + " cannot be written (" + (ec ? ec.message() : std::strerror(errno)) +
                          "); each rank tokenizes its own copy (set tokenized_cache_dir to a writable folder)");
    } else {
      std::vector<std::string> files = tokenizer_files(tokenizer_dir(config));
      for (auto& f : data::dataset_source_files(datasets, config.dataset_dir, file, config.stage == "pt")) files.push_back(std::move(f));
      path = (fs::path(cache) / (rows_key(settings, files) + ".hprows")).string();
    }
  }
  data::TokenRows rows;
  if (path.empty()) {
    rows = tokenize();
  } else {
    std::optional<std::chrono::system_clock::time_point> rebuild_before;
    if (config.overwrite_cache && folder.empty()) rebuild_before = started;
    SavedRows saved = load_or_build_rows(path, rebuild_before, tokenize, out.notes);
    out.notes.push_back(name + " data: " + (saved.origin == RowsOrigin::kReadFromFile ? "read from " : "saved to ") + path);
    rows = std::move(saved.rows);
  }
  add_report(rows, path.empty() ? name + " rows" : path, out, count);
  ::malloc_trim(0);  // the records and the wide rows of tokenizing are freed: give their pages back
  return rows;
}

// tokenized_path holding rows saved before: read them, whatever the dataset keys say (a
// warning names the settings that differ).
bool read_saved_folder(const TrainConfig& config, TrainData& out) {
  const fs::path folder(config.tokenized_path);
  const fs::path train = folder / "train.hprows", eval = folder / "eval.hprows";
  if (!fs::exists(train)) {
    for (const char* arrow : {"dataset_dict.json", "state.json", "dataset_info.json"}) {
      if (fs::exists(folder / arrow)) {
        throw UserError("tokenized_path " + folder.string() + " holds a dataset saved by LlamaFactory (" + arrow +
                        ", Arrow files), which cannot be read here; point tokenized_path at a new folder and the data is "
                        "tokenized and saved there in this trainer's format");
      }
    }
    return false;
  }
  out.rows = data::TokenRows::open(train.string());
  add_report(out.rows, train.string(), out, &out.conversations);
  out.notes.push_back("train data: read from " + train.string() + " (tokenized_path: the dataset keys are not read)");
  nlohmann::json settings = nlohmann::json::parse(out.rows.meta()).value("settings", nlohmann::json::object());
  if (!settings.is_object()) settings = nlohmann::json::object();
  const auto now = rows_settings(config, config.dataset, config.dataset_file.path.empty() ? nullptr : &config.dataset_file);
  std::string differ;
  for (const char* key : {"stage", "template", "cutoff_len", "packing", "train_on_prompt", "mask_history", "enable_thinking"}) {
    if (settings.value(key, nlohmann::json()) != now[key]) differ += std::string(differ.empty() ? "" : ", ") + key;
  }
  if (!differ.empty()) {
    out.notes.push_back("warning: tokenized_path " + folder.string() + " was made with other " + differ +
                        " than this config sets; its rows are used as they are (delete the folder to tokenize again)");
  }
  if (fs::exists(eval)) {
    out.eval_rows = data::TokenRows::open(eval.string());
    add_report(out.eval_rows, eval.string(), out, nullptr);
  }
  return true;
}

}  // namespace

TrainData prepare_train_data(const TrainConfig& config) {
  const auto started = std::chrono::system_clock::now();
  TrainData out;
  out.tokenizer = std::make_shared<data::Tokenizer>(data::Tokenizer::from_file(tokenizer_dir(config)));
  const data::SpecialTokens& special = out.tokenizer->special_tokens();
  const std::string pad = !special.pad.empty() ? special.pad : special.eos;
  out.pad_id = pad.empty() ? 0 : out.tokenizer->token_to_id(pad).value_or(0);
  if (!config.do_train) return out;  // the tokenizer only: nothing to train on

  const std::string& folder = config.tokenized_path;
  std::optional<FileLock> folder_lock;  // the folder's train and eval files are made together
  if (!folder.empty()) {
    std::error_code ec;
    fs::create_directories(folder, ec);
    if (ec) throw UserError("tokenized_path " + folder + " cannot be created (" + ec.message() + ")");
    folder_lock.emplace((fs::path(folder) / ".lock").string(), /*only_if_writable=*/true);
  }
  if (folder.empty() || !read_saved_folder(config, out)) {
    const data::DatasetFile* file = config.dataset_file.path.empty() ? nullptr : &config.dataset_file;
    if (!folder.empty() && config.dataset.empty() && !file) {
      throw UserError("tokenized_path " + folder + " holds no tokenized rows (train.hprows) yet, and no dataset is named to make them; "
                      "set dataset (or dataset_file.path) for the first run");
    }
    out.rows = dataset_rows(config, config.dataset, file, *out.tokenizer, folder, "train", started, out, &out.conversations);
    if (!config.eval_dataset.empty()) {
      out.eval_rows = dataset_rows(config, config.eval_dataset, nullptr, *out.tokenizer, folder, "eval", started, out, nullptr);
    }
  }
  folder_lock.reset();
  if (config.eval_dataset.empty() && out.eval_rows.empty() && config.val_size > 0) {
    out.eval_rows = split_validation(out.rows, config.val_size, static_cast<uint64_t>(config.seed));
  }
  for (int64_t i = 0; i < out.rows.size(); ++i) out.label_tokens.push_back(out.rows.label_tokens(i));
  return out;
}

}  // namespace hyperparallel::train
