// TokenRows: a dataset's labelled token rows in one compact, immutable store that can live
// in a file and be memory-mapped, so the ranks of a job share one copy of the tokenized data.
//
// A row is what data/sft_samples.h and data/pretrain_samples.h build (TrainingRow): its
// labels are its ids or kIgnoreLabel, and its position_ids count 0, 1, ... restarting at each
// packed sample. So a token is stored as an int32 id and one mark byte (bit 0: labelled;
// bit 1: positions restart here): 5 bytes instead of TrainingRow's 24. from_rows refuses a
// row that does not have that shape (std::logic_error: a builder broke its contract).
//
// File (".hprows", little-endian): a 64-byte header {magic "HPROWS\0\1", rows, tokens,
// meta bytes, 4 reserved words}, then uint64 offsets[rows + 1], int32 ids[tokens],
// uint8 marks[tokens], then `meta` (JSON text the caller keeps beside the rows: reports,
// the settings that made them). open() checks everything a reader relies on -- sizes,
// offsets, ids in [0, 2^31) -- and throws UserError naming the file otherwise, so a
// truncated or foreign file never reaches the model. save() writes PATH.tmp.PID and renames
// it over PATH: a reader sees the old file or the new one, never a part.
//
// select() makes a view of some rows in a new order over the same store (the val_size
// split); copies share the store, which is freed (or unmapped) with the last of them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hyperparallel/data/sft_samples.h"

namespace hyperparallel::data {

class TokenRows {
 public:
  TokenRows();  // no rows
  static TokenRows from_rows(const std::vector<TrainingRow>& rows, std::string meta = "");
  static TokenRows open(const std::string& path);  // memory-mapped, read-only

  void save(const std::string& path) const;  // the selected rows, in their order, and meta

  int64_t size() const;
  bool empty() const { return size() == 0; }
  int64_t length(int64_t i) const;       // tokens in row i
  int64_t label_tokens(int64_t i) const;  // labels a next-token loss uses (all but the row's first)
  TrainingRow row(int64_t i) const;
  int64_t total_tokens() const;  // over the selected rows
  int64_t max_id() const;        // over the whole store; -1 when it has no tokens
  const std::string& meta() const;
  bool mapped() const;  // backed by a memory-mapped file
  TokenRows select(std::vector<int64_t> indices) const;

  struct Store;

 private:
  explicit TokenRows(std::shared_ptr<const Store> store);
  int64_t stored(int64_t i) const;  // index into the store of selected row i
  std::shared_ptr<const Store> store_;
  std::vector<int64_t> order_;  // selected store rows; empty with !selected_ means all
  bool selected_ = false;
};

// collate_rows (sft_samples.h) of the rows `indices` picks, in that order.
TokenBatch collate_rows(const TokenRows& rows, const std::vector<int64_t>& indices, int64_t pad_id);

}  // namespace hyperparallel::data
