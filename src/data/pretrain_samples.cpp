// Texts to pretraining rows. See data/pretrain_samples.h.
#include "hyperparallel/data/pretrain_samples.h"

#include "hyperparallel/platform/user_error.h"
#include "parallel_map.h"

namespace hyperparallel::data {
namespace {

// A row whose every token but the first is a label, positions 0..n-1.
TrainingRow plain_row(std::vector<int64_t> ids) {
  TrainingRow row;
  row.input_ids = std::move(ids);
  row.labels = row.input_ids;
  if (!row.labels.empty()) row.labels[0] = kIgnoreLabel;
  row.position_ids.resize(row.input_ids.size());
  for (size_t i = 0; i < row.position_ids.size(); ++i) row.position_ids[i] = static_cast<int64_t>(i);
  return row;
}

int64_t token_id(const Tokenizer& tokenizer, const std::string& token, const char* what) {
  const auto id = tokenizer.token_to_id(token);
  if (!id) throw UserError(std::string("stage pt: the ") + what + " token " + token + " is not in the tokenizer's vocabulary");
  return *id;
}

}  // namespace

std::string pretrain_eos_token(const Tokenizer& tokenizer, const std::string& template_name) {
  std::string eos, why, fix;
  if (template_name == "llama3") {
    eos = "<|end_of_text|>";
    why = "template llama3 ends pretraining texts with it, as LlamaFactory does";
    fix = "use the model's own template, or none (then tokenizer_config.json's eos_token is used)";
  } else if (template_name == "qwen" || template_name == "qwen3" || template_name == "qwen3_nothink") {
    eos = "<|im_end|>";
    why = "template " + template_name + "'s stop word, which replaces the eos token in LlamaFactory";
    fix = "use the model's own template, or none (then tokenizer_config.json's eos_token is used)";
  } else {
    eos = tokenizer.special_tokens().eos;
    why = "tokenizer_config.json's eos_token";
    fix = "set eos_token in tokenizer_config.json to a token of tokenizer.json";
    if (eos.empty()) {
      eos = "<|endoftext|>";
      why = "LlamaFactory's eos for a tokenizer without eos_token";
      fix = "set eos_token in tokenizer_config.json (every pretraining text ends with it)";
    }
  }
  if (!tokenizer.token_to_id(eos)) {
    throw UserError("stage pt ends every text with " + eos + " (" + why + "), but the tokenizer has no such token; " + fix);
  }
  return eos;
}

std::string pretrain_bos_token(const Tokenizer& tokenizer) {
  const SpecialTokens& special = tokenizer.special_tokens();
  if (!special.add_bos_token || special.bos.empty()) return "";
  token_id(tokenizer, special.bos, "bos");
  return special.bos;
}

std::vector<TrainingRow> build_pretrain_rows(const Tokenizer& tokenizer, const std::vector<TextSample>& texts,
                                             const PretrainOptions& options, SampleReport* report) {
  const int64_t cutoff = options.cutoff_len;
  if (cutoff < 2) throw UserError("cutoff_len must be at least 2, got " + std::to_string(cutoff));
  if (options.eos_token.empty()) throw UserError("stage pt needs an eos token to end every text (pretrain_eos_token)");
  token_id(tokenizer, options.eos_token, "eos");
  const bool bos = !options.bos_token.empty();
  const int64_t bos_id = bos ? token_id(tokenizer, options.bos_token, "bos") : 0;
  std::vector<TrainingRow> rows;
  if (!options.packing) {
    auto encoded = parallel_map<std::vector<int64_t>>(texts.size(), options.threads, [&](size_t i) {
      return tokenizer.encode(options.bos_token + texts[i].text + options.eos_token);
    });
    for (size_t k = 0; k < texts.size(); ++k) {
      const TextSample& t = texts[k];
      std::vector<int64_t> ids = std::move(encoded[k]);
      if (static_cast<int64_t>(ids.size()) > cutoff) {
        ids.resize(static_cast<size_t>(cutoff));
        if (report) ++report->truncated;
      }
      if (ids.size() < 2) {
        if (report) report->dropped.push_back(t.source + ": " + std::to_string(ids.size()) + " token (an empty text): nothing to predict");
        continue;
      }
      rows.push_back(plain_row(std::move(ids)));
    }
    if (rows.empty()) throw UserError("stage pt: no text gives a row of 2 or more tokens; the datasets hold only empty texts");
    return rows;
  }
  // The concatenation of all encoded texts, cut into blocks in order.
  std::vector<int64_t> block;
  block.reserve(static_cast<size_t>(cutoff));
  int64_t total = 0;
  std::string tail_from;  // the text the unfinished block starts in
  auto encoded = parallel_map<std::vector<int64_t>>(texts.size(), options.threads,
                                                     [&](size_t i) { return tokenizer.encode(texts[i].text + options.eos_token); });
  for (size_t k = 0; k < texts.size(); ++k) {
    const TextSample& t = texts[k];
    const std::vector<int64_t> ids = std::move(encoded[k]);
    total += static_cast<int64_t>(ids.size());
    size_t i = 0;
    while (i < ids.size()) {
      if (block.empty()) tail_from = t.source;
      const size_t take = std::min(ids.size() - i, static_cast<size_t>(cutoff) - block.size());
      block.insert(block.end(), ids.begin() + static_cast<std::ptrdiff_t>(i), ids.begin() + static_cast<std::ptrdiff_t>(i + take));
      i += take;
      if (static_cast<int64_t>(block.size()) == cutoff) {
        if (bos) block[0] = bos_id;
        rows.push_back(plain_row(std::move(block)));
        block = {};
        block.reserve(static_cast<size_t>(cutoff));
      }
    }
  }
  if (rows.empty()) {
    throw UserError("stage pt with packing: the " + std::to_string(texts.size()) + " texts give " + std::to_string(total) +
                    " tokens, fewer than one block of cutoff_len " + std::to_string(cutoff) +
                    "; lower cutoff_len, add text, or set packing: false (one row per text)");
  }
  if (!block.empty() && report) {
    report->dropped.push_back("the last " + std::to_string(block.size()) + " of " + std::to_string(total) +
                              " tokens (from " + tail_from + " on) do not fill a block of cutoff_len " + std::to_string(cutoff));
  }
  return rows;
}

}  // namespace hyperparallel::data
