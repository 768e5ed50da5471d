// GlobalBatchSampler: which rows each data-parallel rank trains on, step by step.
//
// The order of rows in an epoch is a permutation that depends only on (seed, epoch) — a
// Fisher-Yates shuffle driven by SplitMix64 with exact (rejection-sampled) bounded draws, so it
// is the same on every machine, compiler and world size. Step s of an epoch is the global batch
// order[s*G, (s+1)*G) with G = per_device_batch x accumulation x data-parallel degree; a last
// partial batch is dropped. Data-parallel rank r takes the r-th contiguous G/dp slice, cut into
// `accumulation` micro-batches; ranks that split one model (tensor or context parallel) pass
// the same data-parallel rank and so see the same rows. Changing the layout at a fixed G
// changes who computes which row, never which rows form a step, so every layout's step loss is
// the same number.
//
// The position (epoch, step) is a value: save it with a checkpoint, restore it, continue.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hyperparallel::data {

struct SamplerPosition {
  int64_t epoch = 0;
  int64_t step = 0;  // within the epoch
  bool operator==(const SamplerPosition& o) const { return epoch == o.epoch && step == o.step; }
};

class GlobalBatchSampler {
 public:
  // UserError when there are fewer rows than one global batch or sizes are not positive.
  GlobalBatchSampler(int64_t num_rows, int64_t global_batch, uint64_t seed, bool shuffle = true);

  int64_t num_rows() const { return num_rows_; }
  int64_t global_batch() const { return global_batch_; }
  int64_t steps_per_epoch() const { return num_rows_ / global_batch_; }

  // Valid until the next call with another epoch (the last epoch's order is kept).
  const std::vector<int64_t>& epoch_order(int64_t epoch) const;
  std::vector<int64_t> global_batch_rows(const SamplerPosition& position) const;  // G row indices
  SamplerPosition next(const SamplerPosition& position) const;

  // Rows of micro-batch `micro` (of `micro_batches`) for data-parallel rank `dp_rank` of `dp_size`.
  static std::vector<int64_t> rank_micro_batch(const std::vector<int64_t>& global_rows, int64_t dp_rank, int64_t dp_size,
                                               int64_t micro, int64_t micro_batches);

  // {"epoch","step","seed","num_rows","global_batch"} as JSON, and back; restoring checks that
  // the data and the global batch are the ones the position was taken with.
  std::string position_json(const SamplerPosition& position) const;
  SamplerPosition position_from_json(const std::string& json) const;

 private:
  int64_t num_rows_, global_batch_;
  uint64_t seed_;
  bool shuffle_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_order_;
};

}  // namespace hyperparallel::data
