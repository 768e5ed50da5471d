// The chunked loss's on/off and chunk size. See loss_chunking.h.
#include "loss_chunking.h"

#include <algorithm>

namespace hyperparallel::train {
namespace {

int64_t auto_chunk_tokens(int64_t vocab) {
  const int64_t tokens = kAutoChunkLogitsBytes / (4 * std::max<int64_t>(1, vocab));
  const int64_t rounded = (tokens + kAutoChunkMultiple - 1) / kAutoChunkMultiple * kAutoChunkMultiple;
  return std::clamp<int64_t>(rounded, 128, 4096);
}

std::string mib(double bytes) { return std::to_string(static_cast<int64_t>(bytes / (1 << 20))) + " MiB"; }

}  // namespace

LossChunking resolve_loss_chunking(const TrainConfig& c, const models::ModelConfig& model, int64_t cp_size) {
  const int64_t chunk = c.chunked_loss.chunk_size.value_or(auto_chunk_tokens(model.vocab_size));
  if (c.chunked_loss.enabled.has_value()) {
    if (!*c.chunked_loss.enabled) return {0, "chunked_loss.enabled: false"};
    return {chunk, "chunked_loss.enabled: true", true};
  }
  const AcceleratorConfig& a = c.accelerator;
  if (a.sequence_parallel && a.loss_parallel) return {0, "auto: off, the head's input is sequence-sharded (loss_parallel)", true};
  if (a.pp_size > 1 && a.pp_schedule == "zero_bubble") return {0, "auto: off, the zero_bubble schedule splits the backward", true};
  // The longest micro-batch a rank computes the loss on: its rows at cutoff_len, 1/cp of each.
  // In double: the keys are bounded one by one (config_values.h), not their product.
  const double tokens = static_cast<double>(c.per_device_train_batch_size) * static_cast<double>(c.cutoff_len) /
                        static_cast<double>(std::max<int64_t>(1, cp_size));
  const double logits_bytes = tokens * static_cast<double>(model.vocab_size) * 4;
  const std::string size = "a micro-batch's fp32 logits up to " + mib(logits_bytes) + " (" + std::to_string(static_cast<int64_t>(tokens)) + " tokens x " +
                           std::to_string(model.vocab_size) + " vocabulary)";
  if (logits_bytes >= static_cast<double>(kAutoMinLogitsBytes) && tokens >= 2.0 * static_cast<double>(chunk)) return {chunk, "auto: " + size, true};
  return {0, "auto: off, " + size};
}

}  // namespace hyperparallel::train
