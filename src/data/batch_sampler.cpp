// Deterministic global batches. See data/batch_sampler.h.
#include "hyperparallel/data/batch_sampler.h"

#include <nlohmann/json.hpp>
#include <numeric>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::data {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, bound), without modulo bias.
uint64_t bounded(uint64_t& state, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do {
    x = splitmix64(state);
  } while (x >= limit);
  return x % bound;
}

}  // namespace

GlobalBatchSampler::GlobalBatchSampler(int64_t num_rows, int64_t global_batch, uint64_t seed, bool shuffle)
    : num_rows_(num_rows), global_batch_(global_batch), seed_(seed), shuffle_(shuffle) {
  if (global_batch <= 0) throw UserError("the global batch must be positive, got " + std::to_string(global_batch));
  if (num_rows < global_batch) {
    throw UserError("the dataset has " + std::to_string(num_rows) + " rows, fewer than one global batch of " +
                    std::to_string(global_batch) +
                    " (per_device_train_batch_size x gradient_accumulation_steps x data-parallel ranks); use more data or a "
                    "smaller batch");
  }
}

const std::vector<int64_t>& GlobalBatchSampler::epoch_order(int64_t epoch) const {
  if (epoch == cached_epoch_) return cached_order_;
  std::vector<int64_t>& order = cached_order_;
  order.resize(static_cast<size_t>(num_rows_));
  std::iota(order.begin(), order.end(), 0);
  if (shuffle_) {
    uint64_t state = seed_ ^ (0xD1B54A32D192ED03ull * static_cast<uint64_t>(epoch + 1));
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[bounded(state, i)]);
  }
  cached_epoch_ = epoch;
  return order;
}

std::vector<int64_t> GlobalBatchSampler::global_batch_rows(const SamplerPosition& position) const {
  if (position.step < 0 || position.step >= steps_per_epoch()) {
    throw std::out_of_range("sampler step " + std::to_string(position.step) + " outside the epoch's " +
                            std::to_string(steps_per_epoch()) + " steps");
  }
  const std::vector<int64_t>& order = epoch_order(position.epoch);
  const auto first = order.begin() + position.step * global_batch_;
  return std::vector<int64_t>(first, first + global_batch_);
}

SamplerPosition GlobalBatchSampler::next(const SamplerPosition& position) const {
  if (position.step + 1 < steps_per_epoch()) return {position.epoch, position.step + 1};
  return {position.epoch + 1, 0};
}

std::vector<int64_t> GlobalBatchSampler::rank_micro_batch(const std::vector<int64_t>& global_rows, int64_t dp_rank,
                                                          int64_t dp_size, int64_t micro, int64_t micro_batches) {
  const int64_t total = static_cast<int64_t>(global_rows.size());
  if (dp_size <= 0 || micro_batches <= 0 || total % (dp_size * micro_batches) != 0 || dp_rank < 0 || dp_rank >= dp_size ||
      micro < 0 || micro >= micro_batches) {
    throw std::invalid_argument("rank_micro_batch: " + std::to_string(total) + " rows cannot be split into " +
                                std::to_string(dp_size) + " ranks x " + std::to_string(micro_batches) + " micro-batches");
  }
  const int64_t per_micro = total / dp_size / micro_batches;
  const auto first = global_rows.begin() + (dp_rank * micro_batches + micro) * per_micro;
  return std::vector<int64_t>(first, first + per_micro);
}

std::string GlobalBatchSampler::position_json(const SamplerPosition& position) const {
  nlohmann::json j = {{"epoch", position.epoch},
                      {"step", position.step},
                      {"seed", seed_},
                      {"num_rows", num_rows_},
                      {"global_batch", global_batch_}};
  return j.dump();
}

SamplerPosition GlobalBatchSampler::position_from_json(const std::string& text) const {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
    const SamplerPosition position{j.at("epoch").get<int64_t>(), j.at("step").get<int64_t>()};
    const int64_t rows = j.at("num_rows").get<int64_t>(), batch = j.at("global_batch").get<int64_t>();
    const uint64_t seed = j.at("seed").get<uint64_t>();
    if (rows != num_rows_ || seed != seed_) {
      throw UserError("the saved data position is for " + std::to_string(rows) + " rows with seed " + std::to_string(seed) +
                      ", but this run has " + std::to_string(num_rows_) + " rows with seed " + std::to_string(seed_) +
                      "; resume with the same dataset, cutoff_len, packing and seed");
    }
    if (batch != global_batch_) {
      throw UserError("the saved data position is for a global batch of " + std::to_string(batch) + " rows, this run's is " +
                      std::to_string(global_batch_) +
                      "; keep per_device_train_batch_size x gradient_accumulation_steps x data-parallel ranks the same");
    }
    if (position.epoch < 0 || position.step < 0 || position.step >= steps_per_epoch()) {
      throw UserError("the saved data position (epoch " + std::to_string(position.epoch) + ", step " +
                      std::to_string(position.step) + ") is out of range");
    }
    return position;
  } catch (const nlohmann::json::exception& e) {
    throw UserError(std::string("the saved data position is not valid (") + e.what() + ")");
  }
}

}  // namespace hyperparallel::data
