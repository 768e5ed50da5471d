// Conversations to labelled token rows, packing, batches. See data/sft_samples.h.
#include "hyperparallel/data/sft_samples.h"

#include <algorithm>

#include "hyperparallel/platform/user_error.h"
#include "parallel_map.h"

namespace hyperparallel::data {
namespace {

// Tokens of `full` that the encoding of `prefix_text` shares: where the text boundary falls.
size_t token_boundary(const Tokenizer& tokenizer, const std::string& prefix_text, const std::vector<int64_t>& full) {
  const std::vector<int64_t> prefix = tokenizer.encode(prefix_text);
  size_t n = 0;
  while (n < prefix.size() && n < full.size() && prefix[n] == full[n]) ++n;
  return n;
}

int64_t count_labels(const int64_t* labels, size_t n) {
  int64_t count = 0;
  for (size_t t = 1; t < n; ++t) count += labels[t] != kIgnoreLabel;
  return count;
}

}  // namespace

int64_t label_tokens(const TrainingRow& row) { return count_labels(row.labels.data(), row.labels.size()); }

TrainingRow tokenize_conversation(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                  const std::vector<ChatMessage>& messages, const SampleOptions& options) {
  const RenderedChat chat = chat_template.render_with_spans(messages, options.render);
  TrainingRow row;
  row.input_ids = tokenizer.encode(chat.text);
  const size_t n = row.input_ids.size();
  row.position_ids.resize(n);
  for (size_t i = 0; i < n; ++i) row.position_ids[i] = static_cast<int64_t>(i);
  if (options.train_on_prompt) {
    row.labels = row.input_ids;
  } else {
    row.labels.assign(n, kIgnoreLabel);
    const size_t first = options.mask_history && !chat.responses.empty() ? chat.responses.size() - 1 : 0;
    for (size_t r = first; r < chat.responses.size(); ++r) {
      const TextSpan& span = chat.responses[r];
      const size_t begin = token_boundary(tokenizer, chat.text.substr(0, span.begin), row.input_ids);
      const size_t end = span.end == chat.text.size() ? n : token_boundary(tokenizer, chat.text.substr(0, span.end), row.input_ids);
      for (size_t i = begin; i < end; ++i) row.labels[i] = row.input_ids[i];
    }
  }
  if (n > 0) row.labels[0] = kIgnoreLabel;
  return row;
}

std::vector<TrainingRow> build_sft_rows(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                        const std::vector<Conversation>& conversations, const SampleOptions& options,
                                        SampleReport* report) {
  if (options.cutoff_len < 2) throw UserError("cutoff_len must be at least 2, got " + std::to_string(options.cutoff_len));
  // Each conversation on its own (in parallel), then the rows and the report in order.
  std::vector<TrainingRow> all = parallel_map<TrainingRow>(conversations.size(), options.threads, [&](size_t i) {
    const Conversation& c = conversations[i];
    SampleOptions with_tools = options;
    with_tools.render.tools = c.tools;
    try {
      return tokenize_conversation(tokenizer, chat_template, c.messages, with_tools);
    } catch (const UserError& e) {
      throw UserError(c.source + ": " + e.what());
    }
  });
  std::vector<TrainingRow> rows;
  rows.reserve(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    TrainingRow& row = all[i];
    if (static_cast<int64_t>(row.input_ids.size()) > options.cutoff_len) {
      for (auto* v : {&row.input_ids, &row.labels, &row.position_ids}) v->resize(options.cutoff_len);
      if (report) ++report->truncated;
    }
    if (std::all_of(row.labels.begin(), row.labels.end(), [](int64_t l) { return l == kIgnoreLabel; })) {
      if (report) {
        report->dropped.push_back(conversations[i].source + ": no response tokens within cutoff_len " + std::to_string(options.cutoff_len));
      }
      continue;
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<TrainingRow> pack_rows(const std::vector<TrainingRow>& rows, int64_t cutoff_len) {
  std::vector<TrainingRow> packed;
  for (const TrainingRow& row : rows) {
    const int64_t len = static_cast<int64_t>(row.input_ids.size());
    if (len > cutoff_len) {
      throw UserError("a sample of " + std::to_string(len) + " tokens does not fit cutoff_len " + std::to_string(cutoff_len));
    }
    if (packed.empty() || static_cast<int64_t>(packed.back().input_ids.size()) + len > cutoff_len) packed.emplace_back();
    TrainingRow& target = packed.back();
    target.input_ids.insert(target.input_ids.end(), row.input_ids.begin(), row.input_ids.end());
    target.labels.insert(target.labels.end(), row.labels.begin(), row.labels.end());
    for (int64_t i = 0; i < len; ++i) target.position_ids.push_back(i);
  }
  return packed;
}

int64_t TokenBatch::label_tokens() const {
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) count += count_labels(labels.data() + r * length, static_cast<size_t>(length));
  return count;
}

TokenBatch collate_rows(const std::vector<const TrainingRow*>& rows, int64_t pad_id, int64_t length) {
  TokenBatch batch;
  batch.rows = static_cast<int64_t>(rows.size());
  for (const TrainingRow* row : rows) length = std::max<int64_t>(length, static_cast<int64_t>(row->input_ids.size()));
  batch.length = length;
  const size_t total = static_cast<size_t>(batch.rows * length);
  batch.input_ids.assign(total, pad_id);
  batch.labels.assign(total, kIgnoreLabel);
  batch.attention_mask.assign(total, 0);
  batch.position_ids.assign(total, 0);
  for (int64_t r = 0; r < batch.rows; ++r) {
    const TrainingRow& row = *rows[r];
    const int64_t n = static_cast<int64_t>(row.input_ids.size());
    const size_t base = static_cast<size_t>(r * length);
    std::copy(row.input_ids.begin(), row.input_ids.end(), batch.input_ids.begin() + base);
    std::copy(row.labels.begin(), row.labels.end(), batch.labels.begin() + base);
    std::copy(row.position_ids.begin(), row.position_ids.end(), batch.position_ids.begin() + base);
    std::fill_n(batch.attention_mask.begin() + base, n, 1);
    int64_t next = n ? row.position_ids.back() + 1 : 0;
    for (int64_t t = n; t < length; ++t) batch.position_ids[base + t] = next++;
  }
  return batch;
}

}  // namespace hyperparallel::data
