// BPE merges. See bpe_model.h.
#include "bpe_model.h"

#include <cstdio>
#include <queue>

#include "hyperparallel/platform/user_error.h"
#include "utf8.h"

namespace hyperparallel::data {
namespace {
uint64_t pair_key(int64_t a, int64_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b); }
}  // namespace

BpeModel::BpeModel(std::unordered_map<std::string, int64_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   Options options, const std::string& where)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab_) {
    if (id < 0 || id > (int64_t{1} << 31)) throw UserError(where + ": vocabulary id " + std::to_string(id) + " is out of range");
    max_id = std::max(max_id, id);
  }
  id_to_token_.resize(max_id + 1);
  for (const auto& [token, id] : vocab_) id_to_token_[id] = token;
  merges_.reserve(merges.size() * 2);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = vocab_.find(a), ib = vocab_.find(b), im = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || im == vocab_.end()) {
      throw UserError(where + ": merge " + std::to_string(rank) + " ('" + a + "' '" + b + "') uses a token not in the vocabulary");
    }
    merges_.emplace(pair_key(ia->second, ib->second), Merge{static_cast<int32_t>(rank), im->second});
  }
  if (options_.unk_token) {
    auto it = vocab_.find(*options_.unk_token);
    if (it != vocab_.end()) unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(name);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

std::optional<int64_t> BpeModel::token_to_id(const std::string& token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string& BpeModel::id_to_token(int64_t id) const {
  static const std::string empty;
  return id >= 0 && id < size() ? id_to_token_[id] : empty;
}

void BpeModel::encode(const std::string& piece, std::vector<int64_t>& out) const {
  if (piece.size() > kMaxCachedBytes) {  // long pieces (a whole unsplit text) are not cached
    encode_uncached(piece, out);
    return;
  }
  CacheShard& shard = cache_[std::hash<std::string>{}(piece) % kCacheShards];
  {
    std::lock_guard<std::mutex> lock(shard.mutex);
    auto it = shard.entries.find(piece);
    if (it != shard.entries.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int64_t> ids;
  encode_uncached(piece, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(shard.mutex);
  if (shard.entries.size() >= kCacheLimit / kCacheShards) shard.entries.clear();
  shard.entries.emplace(piece, std::move(ids));
}

void BpeModel::encode_uncached(const std::string& piece, std::vector<int64_t>& out) const {
  if (piece.empty()) return;
  if (options_.ignore_merges) {
    auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Initial symbols: one per character, or its bytes / unk when it is not in the vocabulary.
  std::vector<int64_t> symbols;
  bool last_was_unk = false;
  for (size_t i = 0; i < piece.size();) {
    const size_t n = utf8_char_length(piece, i);
    auto it = vocab_.find(piece.substr(i, n));
    if (it != vocab_.end()) {
      symbols.push_back(it->second);
      last_was_unk = false;
    } else {
      bool bytes_ok = options_.byte_fallback;
      for (size_t k = 0; bytes_ok && k < n; ++k) bytes_ok = byte_ids_[static_cast<unsigned char>(piece[i + k])] >= 0;
      if (bytes_ok) {
        for (size_t k = 0; k < n; ++k) symbols.push_back(byte_ids_[static_cast<unsigned char>(piece[i + k])]);
        last_was_unk = false;
      } else if (unk_id_) {
        if (!(options_.fuse_unk && last_was_unk)) symbols.push_back(*unk_id_);
        last_was_unk = true;
      } else {
        throw UserError("tokenizer: character '" + piece.substr(i, n) + "' is not in the vocabulary and there is no unk_token");
      }
    }
    i += n;
  }
  // Merge the lowest-ranked adjacent pair until none applies (linked list + heap).
  const size_t count = symbols.size();
  std::vector<int64_t> prev(count), next(count);
  for (size_t i = 0; i < count; ++i) {
    prev[i] = static_cast<int64_t>(i) - 1;
    next[i] = i + 1 < count ? static_cast<int64_t>(i + 1) : -1;
  }
  struct Candidate {
    int32_t rank;
    int64_t left;
    int64_t left_id, right_id;  // the symbols it was computed for (stale entries are skipped)
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int64_t left) {
    const int64_t right = next[left];
    if (right < 0) return;
    auto it = merges_.find(pair_key(symbols[left], symbols[right]));
    if (it != merges_.end()) heap.push({it->second.rank, left, symbols[left], symbols[right]});
  };
  for (size_t i = 0; i + 1 < count; ++i) push(static_cast<int64_t>(i));
  std::vector<bool> alive(count, true);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int64_t right = next[c.left];
    if (!alive[c.left] || right < 0 || symbols[c.left] != c.left_id || symbols[right] != c.right_id) continue;
    symbols[c.left] = merges_.at(pair_key(c.left_id, c.right_id)).id;
    alive[right] = false;
    next[c.left] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.left;
    if (prev[c.left] >= 0) push(prev[c.left]);
    push(c.left);
  }
  for (int64_t i = 0; i >= 0 && i < static_cast<int64_t>(count); i = next[i]) out.push_back(symbols[i]);
}

}  // namespace hyperparallel::data
