// BpeModel: the BPE model of a tokenizer.json ("model": {"type": "BPE", ...}).
//
// A pre-token is cut into symbols (its characters; with byte_fallback, a character missing
// from the vocabulary becomes its <0xXX> byte tokens; otherwise the unk token, consecutive
// ones fused when fuse_unk), then adjacent pairs merge lowest rank first until no listed
// merge applies — `tokenizers`' algorithm. ignore_merges (Llama 3): a pre-token that is
// itself a vocabulary entry is emitted whole. Merge ranks live in a hash map keyed by the
// pair of ids; results are cached per pre-token of up to 256 bytes (bounded), as the
// reference caches words.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace hyperparallel::data {

class BpeModel {
 public:
  struct Options {
    bool ignore_merges = false;
    bool byte_fallback = false;
    bool fuse_unk = false;
    std::optional<std::string> unk_token;
  };
  // merges: pairs of token strings in rank order. Throws UserError (naming `where`) when a
  // merge names a token the vocabulary lacks.
  BpeModel(std::unordered_map<std::string, int64_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           Options options, const std::string& where);

  void encode(const std::string& piece, std::vector<int64_t>& out) const;
  std::optional<int64_t> token_to_id(const std::string& token) const;
  const std::string& id_to_token(int64_t id) const;  // "" when unknown
  int64_t size() const { return static_cast<int64_t>(id_to_token_.size()); }

 private:
  void encode_uncached(const std::string& piece, std::vector<int64_t>& out) const;

  struct Merge {
    int32_t rank;
    int64_t id;
  };
  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, Merge> merges_;
  Options options_;
  std::optional<int64_t> unk_id_;
  int64_t byte_ids_[256];

  static constexpr size_t kCacheLimit = 1 << 18;  // pre-tokens over all shards
  static constexpr size_t kMaxCachedBytes = 256;  // as the reference's word cache
  // The cache in shards by the pre-token's hash, each with its own lock, so threads that
  // tokenize together (data/parallel_map.h) rarely wait for one another.
  static constexpr size_t kCacheShards = 16;
  struct CacheShard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int64_t>> entries;
  };
  mutable CacheShard cache_[kCacheShards];
};

}  // namespace hyperparallel::data
