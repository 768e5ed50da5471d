// Pretraining rows (stage pt): texts -> token rows in which every token is trained, as
// LlamaFactory's PretrainDatasetProcessor makes them.
//
// Every text gets the eos token appended (pretrain_eos_token: the tokenizer's, except that a
// template whose stop word replaces it in LlamaFactory -- qwen, qwen3, qwen3_nothink:
// <|im_end|> -- or llama3, which LlamaFactory special-cases to <|end_of_text|>, decides it)
// and is encoded as one string, `text + eos`, without the post-processor's special tokens.
//
//   packing (LlamaFactory's default for pt): the encoded texts are concatenated in order and
//     cut into blocks of exactly cutoff_len tokens; the tail that does not fill a block is
//     left out (reported). position_ids run 0..cutoff_len-1 over the whole block: documents
//     in a block attend to each other, as in LlamaFactory and Hugging Face's run_clm (no
//     restart per document, unlike SFT packing). A tokenizer that adds bos (add_bos_token)
//     gets each block's first token replaced by bos, as LlamaFactory does.
//   no packing: each text is one row, bos + text + eos (bos when add_bos_token), cut at
//     cutoff_len (reported); a row of one token has nothing to predict and is left out
//     (reported).
//
// Labels are the input ids, except the first of each row, which is kIgnoreLabel: nothing
// predicts it. The model's next-token loss (logits at t against labels at t+1) then takes
// exactly the n-1 predictions Hugging Face's causal-LM loss takes from a block of n tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hyperparallel/data/pretrain_dataset.h"
#include "hyperparallel/data/sft_samples.h"
#include "hyperparallel/data/tokenizer.h"

namespace hyperparallel::data {

struct PretrainOptions {
  int64_t cutoff_len = 2048;
  bool packing = true;
  std::string eos_token;  // appended to every text (pretrain_eos_token); must be a token
  std::string bos_token;  // "" for none (pretrain_bos_token)
  int threads = 1;        // texts encoded in parallel; the rows do not depend on it
};

// The token ending every text for `template_name` ("" = none): see above. UserError when the
// tokenizer lacks it (a tokenizer without eos_token falls back to <|endoftext|> when it has
// that token, as LlamaFactory does).
std::string pretrain_eos_token(const Tokenizer& tokenizer, const std::string& template_name);

// The tokenizer's bos token when it adds one (SpecialTokens::add_bos_token), else "".
std::string pretrain_bos_token(const Tokenizer& tokenizer);

// Rows for all texts, in order. `report` gets the texts cut at cutoff_len, and what was left
// out. UserError when packing leaves no block (fewer tokens than cutoff_len) or no row is left.
std::vector<TrainingRow> build_pretrain_rows(const Tokenizer& tokenizer, const std::vector<TextSample>& texts,
                                             const PretrainOptions& options, SampleReport* report = nullptr);

}  // namespace hyperparallel::data
