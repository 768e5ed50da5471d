// The trainer's data: dataset names -> labelled rows (packed if asked) -> the sampler's input.
// stage sft: conversations through the chat template (data/sft_samples.h); stage pt: plain
// texts, every token labelled, packed into blocks unless packing is false
// (data/pretrain_samples.h). The rows are made once per machine, in threads, into a file
// that every rank maps (tokenized_cache.h; tokenized_path, or the keyed cache), or without a
// cache in each rank's memory; the same rows either way. The sampler then picks each rank's
// share.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hyperparallel/data/sft_dataset.h"
#include "hyperparallel/data/sft_samples.h"
#include "hyperparallel/data/token_rows.h"
#include "hyperparallel/data/tokenizer.h"
#include "hyperparallel/train/train_config.h"

namespace hyperparallel::train {

struct TrainData {
  std::shared_ptr<data::Tokenizer> tokenizer;
  data::TokenRows rows;
  data::TokenRows eval_rows;  // eval_dataset's rows, or the val_size split of the data
  std::vector<int64_t> label_tokens;  // per row, the labels a next-token loss uses
  int64_t pad_id = 0;
  int64_t conversations = 0;  // conversations (sft) or texts (pt) read
  data::SftLoadReport load_report;
  data::SampleReport sample_report;
  std::vector<std::string> notes;  // where the rows came from, and anything the user should know about it
};

// The tokenizer folder: `tokenizer`, else the model folder (UserError for a debug flavour
// without one).
std::string tokenizer_dir(const TrainConfig& config);

// The config's chat template, with default_system and tool_format applied when the config sets them.
data::ChatTemplate chat_template_for(const TrainConfig& config, const data::Tokenizer& tokenizer);

// With do_train false only the tokenizer is loaded.
TrainData prepare_train_data(const TrainConfig& config);

}  // namespace hyperparallel::train
