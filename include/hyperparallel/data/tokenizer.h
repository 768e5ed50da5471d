// Tokenizer: Hugging Face tokenizer.json, encode and decode, in C++.
//
// The pipeline is the `tokenizers` library's: added tokens are matched first (longest
// match, on the raw text) and never split; each stretch between them is normalized (NFC,
// Prepend, Replace, Sequence), pre-tokenized (Split by a regex, run on Oniguruma like the
// reference so `\s` means the same; ByteLevel), and cut by the BPE model (merge ranks;
// ignore_merges; byte_fallback and fuse_unk for SentencePiece-style vocabularies). Decoding
// runs the configured decoder (ByteLevel, or Replace + ByteFallback + Fuse + Strip).
// Supported: byte-level BPE (Qwen2/Qwen3, Llama 3) and SentencePiece-style BPE with byte
// fallback (Llama 2, Mistral). Anything else in a tokenizer.json is a UserError naming the
// component, never a silent difference. Encoding results per pre-token are cached.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hyperparallel::data {

// bos / eos / pad token strings from tokenizer_config.json next to tokenizer.json; "" when
// the file or the entry is absent. add_bos_token is the file's "add_bos_token" or, without
// one, transformers' class default (true for LlamaTokenizer / CodeLlamaTokenizer /
// GemmaTokenizer and their Fast variants, else false); pretraining reads it.
struct SpecialTokens {
  std::string bos, eos, pad;
  bool add_bos_token = false;
};

class Tokenizer {
 public:
  // `path` is a tokenizer.json file, or a model folder that has one. Throws UserError.
  static Tokenizer from_file(const std::string& path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // add_special_tokens: wrap in the post-processor's template (e.g. Mistral's <s>); the
  // ByteLevel post-processor adds nothing.
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = false) const;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;
  std::optional<int64_t> token_to_id(const std::string& token) const;
  std::string id_to_token(int64_t id) const;  // "" for unknown ids
  int64_t vocab_size() const;                 // model vocabulary plus added tokens
  bool is_special(int64_t id) const;
  const SpecialTokens& special_tokens() const;
  // The ids that end an assistant turn: eos and the chat templates' end markers
  // (<|im_end|>, <|eot_id|>, </s>, <|endoftext|>) that the vocabulary has.
  std::vector<int64_t> end_of_turn_ids() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Copies the tokenizer files of a Hugging Face folder that `from` has (tokenizer.json,
// tokenizer_config.json, special_tokens_map.json, vocab.json, merges.txt, tokenizer.model)
// into the folder `to`, replacing them there; returns the names copied. `from` may be a
// tokenizer.json file (its folder is used).
std::vector<std::string> copy_tokenizer_files(const std::string& from, const std::string& to);

}  // namespace hyperparallel::data
