// SFT samples: conversations -> token rows with labels, packing, and batches.
//
// A conversation is rendered once by its chat template (ChatTemplate::render_with_spans) and
// encoded once, so the ids are exactly what the model's own template and tokenizer give at
// inference. Labels are the ids on assistant responses and function calls (their end marker
// included) and -100 elsewhere (observations are prompt, as LlamaFactory pairs them);
// `train_on_prompt` labels every token, `mask_history` only the last response. A response
// boundary inside the text maps to a token boundary by encoding the text up to it and taking
// the common prefix with the full encoding (a BPE merge that straddles the boundary counts as response). The first label of
// every row is -100: nothing predicts a sample's first token, and in a packed row that keeps
// the previous sample from being trained to predict it, so a packed row's loss is exactly the
// sum of its samples' losses.
//
// cutoff_len keeps the first cutoff_len tokens; a sample left without any label token is
// dropped and reported. Packing concatenates samples in order (a new row when the next one
// does not fit) with position_ids restarting at 0 per sample, which the models read as
// document boundaries. collate_rows pads right (pad id, label -100, attention 0).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hyperparallel/data/chat_template.h"
#include "hyperparallel/data/sft_dataset.h"
#include "hyperparallel/data/tokenizer.h"

namespace hyperparallel::data {

inline constexpr int64_t kIgnoreLabel = -100;

// One training row: a sample, or several packed samples.
struct TrainingRow {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> labels;        // kIgnoreLabel where no loss is taken
  std::vector<int64_t> position_ids;  // 0.. per sample
};

struct SampleOptions {
  int64_t cutoff_len = 2048;
  bool train_on_prompt = false;
  bool mask_history = false;  // labels on the last assistant response only (LlamaFactory's mask_history)
  ChatRenderOptions render;  // e.g. enable_thinking
  int threads = 1;           // conversations tokenized in parallel; the rows do not depend on it
};

struct SampleReport {
  int64_t truncated = 0;             // samples cut at cutoff_len
  std::vector<std::string> dropped;  // "source: why" for samples without label tokens
};

// One conversation as a row (not truncated); a tool conversation's tools go in options.render.tools.
TrainingRow tokenize_conversation(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                  const std::vector<ChatMessage>& messages, const SampleOptions& options);

// All conversations (each with its own tools), truncated to cutoff_len; rows without label
// tokens are left out. A conversation the template cannot render is a UserError naming its source.
std::vector<TrainingRow> build_sft_rows(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                        const std::vector<Conversation>& conversations, const SampleOptions& options,
                                        SampleReport* report = nullptr);

// Labels a next-token loss uses: all but the row's first (nothing predicts it).
int64_t label_tokens(const TrainingRow& row);

// Rows concatenated in order into rows of at most cutoff_len tokens.
std::vector<TrainingRow> pack_rows(const std::vector<TrainingRow>& rows, int64_t cutoff_len);

// A batch as row-major [rows, length] arrays, ready to become tensors.
struct TokenBatch {
  int64_t rows = 0, length = 0;
  std::vector<int64_t> input_ids, labels, attention_mask, position_ids;
  int64_t label_tokens() const;  // labels that a next-token loss uses (all but each row's first)
};

// Pads right to `length` (0: the longest row). Padding positions continue counting.
TokenBatch collate_rows(const std::vector<const TrainingRow*>& rows, int64_t pad_id, int64_t length = 0);

}  // namespace hyperparallel::data
