// Byte-level BPE training. See data/bpe_trainer.h.
#include "hyperparallel/data/bpe_trainer.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "data/utf8.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::data {
namespace {

using Json = nlohmann::json;

constexpr const char* kQwenPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

enum class CharClass { kLetter, kDigit, kSpace, kNewline, kOther };

CharClass classify(unsigned char c) {
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return CharClass::kLetter;
  if (c >= 0x80) return CharClass::kLetter;  // treat non-ASCII as letters: never split inside a character
  if (c >= '0' && c <= '9') return CharClass::kDigit;
  if (c == '\n' || c == '\r') return CharClass::kNewline;
  if (c == ' ' || c == '\t') return CharClass::kSpace;
  return CharClass::kOther;
}

// Pre-tokens of one stretch (no special tokens in it), by the regex's classes for ASCII.
void pre_tokenize(const std::string& s, std::map<std::string, int64_t>& counts) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    const CharClass c = classify(static_cast<unsigned char>(s[i]));
    const bool next_is_letter = i + 1 < s.size() && classify(static_cast<unsigned char>(s[i + 1])) == CharClass::kLetter;
    if (c == CharClass::kLetter || ((c == CharClass::kSpace || c == CharClass::kOther) && next_is_letter)) {
      ++i;
      while (i < s.size() && classify(static_cast<unsigned char>(s[i])) == CharClass::kLetter) ++i;
    } else if (c == CharClass::kDigit) {
      ++i;
    } else if (c == CharClass::kOther || (c == CharClass::kSpace && s[i] == ' ' && i + 1 < s.size() &&
                                          classify(static_cast<unsigned char>(s[i + 1])) == CharClass::kOther)) {
      ++i;
      while (i < s.size() && classify(static_cast<unsigned char>(s[i])) == CharClass::kOther) ++i;
    } else {
      while (i < s.size() && (classify(static_cast<unsigned char>(s[i])) == CharClass::kSpace ||
                              classify(static_cast<unsigned char>(s[i])) == CharClass::kNewline)) {
        ++i;
      }
    }
    ++counts[s.substr(start, i - start)];
  }
}

}  // namespace

std::string train_byte_level_bpe(const std::vector<std::string>& texts, const BpeTrainerOptions& options) {
  const int64_t specials = static_cast<int64_t>(options.special_tokens.size());
  if (options.vocab_size < 256 + specials) {
    throw UserError("vocab_size " + std::to_string(options.vocab_size) + " leaves no room for the 256 bytes and " +
                    std::to_string(specials) + " special tokens");
  }
  std::map<std::string, int64_t> counts;
  for (const std::string& text : texts) {
    size_t start = 0;
    while (start < text.size()) {
      size_t cut = text.size(), len = 0;
      for (const auto& sp : options.special_tokens) {
        const size_t at = text.find(sp, start);
        if (at != std::string::npos && at < cut) {
          cut = at;
          len = sp.size();
        }
      }
      pre_tokenize(text.substr(start, cut - start), counts);
      start = cut + len;
    }
  }
  const ByteLevelAlphabet alphabet;
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) vocab.push_back(alphabet.encode_byte(static_cast<unsigned char>(b)));
  struct Word {
    std::vector<int64_t> symbols;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [piece, count] : counts) {
    Word w{{}, count};
    for (unsigned char b : piece) w.symbols.push_back(b);
    words.push_back(std::move(w));
  }
  std::vector<std::pair<int64_t, int64_t>> merges;
  while (static_cast<int64_t>(vocab.size()) + specials < options.vocab_size) {
    std::map<std::pair<int64_t, int64_t>, int64_t> pairs;
    for (const Word& w : words) {
      for (size_t k = 0; k + 1 < w.symbols.size(); ++k) pairs[{w.symbols[k], w.symbols[k + 1]}] += w.count;
    }
    const std::pair<int64_t, int64_t>* best = nullptr;
    int64_t best_count = 0;
    for (const auto& [pair, count] : pairs) {
      const bool better = count > best_count ||
                          (count == best_count && best &&
                           std::make_pair(vocab[pair.first], vocab[pair.second]) < std::make_pair(vocab[best->first], vocab[best->second]));
      if (better) {
        best = &pair;
        best_count = count;
      }
    }
    if (!best || best_count < options.min_frequency) break;
    const auto [a, b] = *best;
    const int64_t merged = static_cast<int64_t>(vocab.size());
    vocab.push_back(vocab[a] + vocab[b]);
    merges.emplace_back(a, b);
    for (Word& w : words) {
      std::vector<int64_t> out;
      for (size_t k = 0; k < w.symbols.size(); ++k) {
        if (k + 1 < w.symbols.size() && w.symbols[k] == a && w.symbols[k + 1] == b) {
          out.push_back(merged);
          ++k;
        } else {
          out.push_back(w.symbols[k]);
        }
      }
      w.symbols = std::move(out);
    }
  }
  const Json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  Json vocab_json = Json::object();
  for (size_t id = 0; id < vocab.size(); ++id) vocab_json[vocab[id]] = id;
  Json merges_json = Json::array();
  for (const auto& [a, b] : merges) merges_json.push_back({vocab[a], vocab[b]});
  Json added = Json::array();
  for (size_t k = 0; k < options.special_tokens.size(); ++k) {
    added.push_back({{"id", vocab.size() + k}, {"content", options.special_tokens[k]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  const Json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", kQwenPattern}}}, {"behavior", "Isolated"}, {"invert", false}}, byte_level}}}},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab_json}, {"merges", merges_json}}}};
  return tokenizer.dump(2);
}

void train_and_save_tokenizer(const std::vector<std::string>& texts, const std::string& dir, const BpeTrainerOptions& options) {
  const std::string json = train_byte_level_bpe(texts, options);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json", std::ios::trunc) << json << "\n";
  const Json config = {{"tokenizer_class", "Qwen2Tokenizer"}, {"model_max_length", 32768}, {"bos_token", nullptr},
                       {"eos_token", options.eos_token},      {"pad_token", options.pad_token},  {"clean_up_tokenization_spaces", false},
                       {"split_special_tokens", false}};
  std::ofstream out(dir + "/tokenizer_config.json", std::ios::trunc);
  out << config.dump(2) << "\n";
  if (!out) throw UserError("cannot write the tokenizer into " + dir);
}

}  // namespace hyperparallel::data
