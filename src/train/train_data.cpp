// The trainer's data pipeline. See train_data.h.
#include "train_data.h"

#include <cmath>

#include "hyperparallel/data/dataset_registry.h"
#include "hyperparallel/data/pretrain_samples.h"
#include "hyperparallel/models/model_config.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::train {

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

// `more` after `all`.
template <typename T>
void append(std::vector<T>& all, std::vector<T> more) {
  all.insert(all.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
}

// Labelled rows of the named datasets (and, with `file`, the dataset file after them), as
// the stage builds them (pt: text blocks; sft: templated conversations, packed when asked).
// `count` gets the texts or conversations read.
std::vector<data::TrainingRow> build_rows(const TrainConfig& config, const std::string& datasets, const data::DatasetFile* file,
                                          const data::Tokenizer& tokenizer, TrainData& out, int64_t& count) {
  data::SftLoadOptions load;
  load.max_samples = config.max_samples;
  load.on_bad_record = config.bad_records == "skip" ? data::BadRecordPolicy::kSkip : data::BadRecordPolicy::kStop;
  if (config.stage == "pt") {
    // LlamaFactory's pretraining: every token of plain texts. See docs/data.md "Pretraining text".
    std::vector<data::TextSample> texts;
    if (!datasets.empty()) texts = data::load_text_datasets(datasets, config.dataset_dir, load, &out.load_report);
    if (file) append(texts, data::load_text_dataset_file(*file, load, &out.load_report));
    count = static_cast<int64_t>(texts.size());
    data::PretrainOptions pretrain;
    pretrain.cutoff_len = config.cutoff_len;
    pretrain.packing = config.packing;
    pretrain.eos_token = data::pretrain_eos_token(tokenizer, config.chat_template);
    pretrain.bos_token = data::pretrain_bos_token(tokenizer);
    return data::build_pretrain_rows(tokenizer, texts, pretrain, &out.sample_report);
  }
  // The template's tool format checks tool records as they load, so a bad one is named file:line.
  const data::ChatTemplate chat_template = chat_template_for(config, tokenizer);
  load.tool_format = chat_template.tool_format();
  std::vector<data::Conversation> conversations;
  if (!datasets.empty()) conversations = data::load_datasets(datasets, config.dataset_dir, load, &out.load_report);
  if (file) append(conversations, data::load_dataset_file(*file, load, &out.load_report));
  count = static_cast<int64_t>(conversations.size());
  data::SampleOptions sample;
  sample.cutoff_len = config.cutoff_len;
  sample.train_on_prompt = config.train_on_prompt;
  sample.mask_history = config.mask_history;
  sample.render.enable_thinking = config.enable_thinking;
  auto rows = data::build_sft_rows(tokenizer, chat_template, conversations, sample, &out.sample_report);
  if (config.packing) rows = data::pack_rows(rows, config.cutoff_len);
  return rows;
}

// val_size rows drawn from `rows` by a seeded shuffle (a fraction below 1, else a count), as
// LlamaFactory splits the preprocessed dataset; the rest stay in order for training.
std::vector<data::TrainingRow> split_validation(std::vector<data::TrainingRow>& rows, double val_size, uint64_t seed) {
  const int64_t n = static_cast<int64_t>(rows.size());
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
  std::vector<data::TrainingRow> eval;
  for (int64_t k = 0; k < take; ++k) {
    held[order[k]] = true;
    eval.push_back(rows[order[k]]);
  }
  std::vector<data::TrainingRow> train;
  for (int64_t i = 0; i < n; ++i) {
    if (!held[i]) train.push_back(std::move(rows[i]));
  }
  rows = std::move(train);
  return eval;
}

}  // namespace

TrainData prepare_train_data(const TrainConfig& config) {
  TrainData out;
  out.tokenizer = std::make_shared<data::Tokenizer>(data::Tokenizer::from_file(tokenizer_dir(config)));
  const data::SpecialTokens& special = out.tokenizer->special_tokens();
  const std::string pad = !special.pad.empty() ? special.pad : special.eos;
  out.pad_id = pad.empty() ? 0 : out.tokenizer->token_to_id(pad).value_or(0);
  if (!config.do_train) return out;  // the tokenizer only: nothing to train on

  const data::DatasetFile* file = config.dataset_file.path.empty() ? nullptr : &config.dataset_file;
  out.rows = build_rows(config, config.dataset, file, *out.tokenizer, out, out.conversations);
  if (!config.eval_dataset.empty()) {
    int64_t eval_count = 0;
    out.eval_rows = build_rows(config, config.eval_dataset, nullptr, *out.tokenizer, out, eval_count);
  } else if (config.val_size > 0) {
    out.eval_rows = split_validation(out.rows, config.val_size, static_cast<uint64_t>(config.seed));
  }
  for (const auto& row : out.rows) out.label_tokens.push_back(data::label_tokens(row));
  return out;
}

}  // namespace hyperparallel::train
