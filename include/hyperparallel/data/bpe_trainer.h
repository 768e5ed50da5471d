// Byte-level BPE training: a small Hugging Face tokenizer.json learned from texts, for models
// built from scratch (the demo's tiny Qwen3 has a 512-token vocabulary).
//
// The result has the Qwen2/Qwen3 layout — NFC normalizer, the Qwen pre-tokenizer regex +
// ByteLevel, a ByteLevel decoder, BPE over GPT-2's byte alphabet (ids 0-255 are the bytes, so
// any text encodes) — and the special tokens as added tokens after the merges. Training splits
// the texts on the special tokens, then into pre-tokens (an optional leading non-letter before
// letters, single digits, punctuation runs, whitespace runs: the regex's classes for ASCII),
// counts them, and repeatedly merges the most frequent adjacent pair (ties: the smaller pair of
// strings) until the vocabulary is full or no pair occurs min_frequency times. Deterministic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hyperparallel::data {

struct BpeTrainerOptions {
  int64_t vocab_size = 512;  // bytes + merges + special tokens
  int64_t min_frequency = 2;
  std::vector<std::string> special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"};
  std::string eos_token = "<|im_end|>";     // written to tokenizer_config.json
  std::string pad_token = "<|endoftext|>";  // written to tokenizer_config.json
};

// tokenizer.json's text.
std::string train_byte_level_bpe(const std::vector<std::string>& texts, const BpeTrainerOptions& options = {});

// Trains and writes dir/tokenizer.json and dir/tokenizer_config.json.
void train_and_save_tokenizer(const std::vector<std::string>& texts, const std::string& dir, const BpeTrainerOptions& options = {});

}  // namespace hyperparallel::data
