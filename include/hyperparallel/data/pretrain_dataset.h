// Plain texts for continued pretraining (stage pt), read as LlamaFactory reads them.
//
// LlamaFactory turns every pretraining record into an alpaca-style prompt and trains on its
// text; the response, system and history columns play no part. So, by file:
//   .txt    every line is one text, as Hugging Face's "text" loader reads it: "\n", "\r\n" and
//           a lone "\r" end a line; a blank line is an empty text (LlamaFactory keeps it: it
//           becomes a lone eos token); a line must be UTF-8.
//   .json / .jsonl, alpaca   the prompt column (DatasetSchema::prompt, a string; "text" for
//           dataset_info.json's {"columns": {"prompt": "text"}}, c4_demo's layout), joined with
//           "\n" to the query column when that is a non-empty string (prompt + "\n" + query, as
//           LlamaFactory's converter does; an empty prompt leaves just the query).
//   .json / .jsonl, sharegpt the first user turn of each (valid) conversation, which is what
//           LlamaFactory's pretrain processor reads from it.
// Records that cannot give a text (the prompt column missing or not a string, not JSON, not
// UTF-8, over kMaxConversationBytes) follow the bad-record policy with `file:line`, as SFT
// files do (data/sft_dataset.h); max_samples keeps the first N texts; empty texts count.
#pragma once

#include <string>
#include <vector>

#include "hyperparallel/data/sft_dataset.h"

namespace hyperparallel::data {

struct TextSample {
  std::string text;
  std::string source;  // file:line or file[#index]
};

// `format` matters for .json / .jsonl only; for .txt the schema is not used. Other file
// endings are a UserError.
std::vector<TextSample> load_text_file(const std::string& path, DatasetFormat format, const SftLoadOptions& options = {},
                                       SftLoadReport* report = nullptr);

}  // namespace hyperparallel::data
