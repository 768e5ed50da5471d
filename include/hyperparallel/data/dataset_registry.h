// Datasets by name, as LlamaFactory's `dataset:` and `dataset_dir:` keys name them.
//
// `names` is a comma-separated list ("alpaca_demo,my_chats"); the datasets are concatenated in
// that order (the sampler shuffles later). Each name is a built-in synthetic dataset
// (data/synthetic_sft.h, its training split) or an entry of DATASET_DIR/dataset_info.json:
//
//   "my_chats": {"file_name": "chats.jsonl", "formatting": "sharegpt",
//                "columns": {"messages": "conversations", "system": "system"},
//                "tags": {"role_tag": "from", "content_tag": "value",
//                         "user_tag": "human", "assistant_tag": "gpt", "system_tag": "system"}}
//
// file_name is relative to dataset_dir (a folder means every .json/.jsonl file in it, in name
// order); formatting is alpaca (default), sharegpt or openai; alpaca columns are prompt, query,
// response, history, system, tools; sharegpt / openai columns messages, system, tools (tools are
// read only when named, as LlamaFactory reads them) and tags role_tag, content_tag, user_tag, assistant_tag,
// system_tag, observation_tag, function_tag. Entries that need a download (hf_hub_url, ms_hub_url, script_url,
// cloud_file_name) or other stages (ranking) are UserErrors, as are unknown names (with a
// suggestion) and unknown fields. max_samples applies to each dataset.
//
// load_text_datasets reads the same entries as pretraining texts (stage pt,
// data/pretrain_dataset.h): a folder then also contributes its .txt files; a .txt file's one
// column is "text" (an entry naming another prompt column for it is an error); with
// "columns" given, a query column is read only when named (LlamaFactory unsets unnamed
// columns: c4_demo's {"prompt": "text"} reads "text" alone). Built-in synthetic datasets are
// chats, not text: naming one is an error with the fix.
//
// A DatasetFile is a dataset named by its path instead (the dataset_file.* config keys;
// HyperParallel's dataset.data_path): read as an entry would be, its path relative to the
// working directory. `column` is the record's turns (sharegpt / openai; "": conversations or
// messages, whichever a record has) or, for pretraining on alpaca-style records, its text
// ("": text). formatting "auto" takes each record as sharegpt when it has the turns column,
// else as alpaca. The tags name a turn's role and content fields only: the role names keep
// their usual spellings (human|user, gpt|assistant, system, observation|tool, function_call).
#pragma once

#include <string>
#include <vector>

#include "hyperparallel/data/pretrain_dataset.h"
#include "hyperparallel/data/sft_dataset.h"

namespace hyperparallel::data {

struct DatasetFile {
  std::string path;
  std::string formatting = "auto";               // auto | alpaca | sharegpt | openai
  std::string column, role_tag, content_tag;  // "": the format's own
  std::string text_template;                 // pretraining: each record rendered instead (DatasetSchema)
};

std::vector<Conversation> load_datasets(const std::string& names, const std::string& dataset_dir,
                                        const SftLoadOptions& options = {}, SftLoadReport* report = nullptr);

std::vector<TextSample> load_text_datasets(const std::string& names, const std::string& dataset_dir,
                                           const SftLoadOptions& options = {}, SftLoadReport* report = nullptr);

std::vector<Conversation> load_dataset_file(const DatasetFile& file, const SftLoadOptions& options = {},
                                            SftLoadReport* report = nullptr);
std::vector<TextSample> load_text_dataset_file(const DatasetFile& file, const SftLoadOptions& options = {},
                                               SftLoadReport* report = nullptr);

// The files the loaders above read for `names` (and `file`, when given), without reading
// them: dataset_info.json when it exists, then each entry's files in order (built-in
// datasets have none). `text`: as load_text_datasets resolves them. What a tokenized cache's
// key hashes (src/train/tokenized_cache.h).
std::vector<std::string> dataset_source_files(const std::string& names, const std::string& dataset_dir, const DatasetFile* file,
                                              bool text);

}  // namespace hyperparallel::data
