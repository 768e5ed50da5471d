// The trainer's data pipeline. See train_data.h.
#include "train_data.h"

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
  const auto chat_template = data::ChatTemplate::named(config.chat_template, tokenizer.special_tokens().eos);
  return config.default_system ? chat_template.with_default_system(*config.default_system) : chat_template;
}

TrainData prepare_train_data(const TrainConfig& config) {
  TrainData out;
  out.tokenizer = std::make_shared<data::Tokenizer>(data::Tokenizer::from_file(tokenizer_dir(config)));
  const data::SpecialTokens& special = out.tokenizer->special_tokens();
  const std::string pad = !special.pad.empty() ? special.pad : special.eos;
  out.pad_id = pad.empty() ? 0 : out.tokenizer->token_to_id(pad).value_or(0);
  if (!config.do_train) return out;  // the tokenizer only: nothing to train on

  data::SftLoadOptions load;
  load.max_samples = config.max_samples;
  load.on_bad_record = config.bad_records == "skip" ? data::BadRecordPolicy::kSkip : data::BadRecordPolicy::kStop;
  if (config.stage == "pt") {
    // LlamaFactory's pretraining: every token of plain texts. See docs/data.md "Pretraining text".
    const auto texts = data::load_text_datasets(config.dataset, config.dataset_dir, load, &out.load_report);
    out.conversations = static_cast<int64_t>(texts.size());
    data::PretrainOptions pretrain;
    pretrain.cutoff_len = config.cutoff_len;
    pretrain.packing = config.packing;
    pretrain.eos_token = data::pretrain_eos_token(*out.tokenizer, config.chat_template);
    pretrain.bos_token = data::pretrain_bos_token(*out.tokenizer);
    out.rows = data::build_pretrain_rows(*out.tokenizer, texts, pretrain, &out.sample_report);
    for (const auto& row : out.rows) out.label_tokens.push_back(data::label_tokens(row));
    return out;
  }
  const auto conversations = data::load_datasets(config.dataset, config.dataset_dir, load, &out.load_report);
  out.conversations = static_cast<int64_t>(conversations.size());

  const auto chat_template = chat_template_for(config, *out.tokenizer);
  data::SampleOptions sample;
  sample.cutoff_len = config.cutoff_len;
  sample.train_on_prompt = config.train_on_prompt;
  sample.mask_history = config.mask_history;
  sample.render.enable_thinking = config.enable_thinking;
  out.rows = data::build_sft_rows(*out.tokenizer, chat_template, conversations, sample, &out.sample_report);
  if (config.packing) out.rows = data::pack_rows(out.rows, config.cutoff_len);
  for (const auto& row : out.rows) out.label_tokens.push_back(data::label_tokens(row));
  return out;
}

}  // namespace hyperparallel::train
