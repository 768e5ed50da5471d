// The zigzag split of a batch's rows over cp ranks. See cp/context_parallel.h.
#include <ATen/ATen.h>

#include "hyperparallel/cp/context_parallel.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::cp {
namespace {

// `t` [B, L0] padded at the end to [B, L] with `value`.
at::Tensor pad_rows(const at::Tensor& t, int64_t length, int64_t value) {
  if (t.size(1) == length) return t;
  return at::cat({t, at::full({t.size(0), length - t.size(1)}, value, t.options())}, 1);
}

}  // namespace

int64_t padded_length(int64_t length, int64_t cp_size) {
  const int64_t unit = 2 * cp_size;
  return (length + unit - 1) / unit * unit;
}

at::Tensor zigzag_index(int64_t length, int64_t cp_size, int64_t rank) {
  if (cp_size < 1 || rank < 0 || rank >= cp_size || length % (2 * cp_size) != 0) {
    throw UserError("zigzag_index: a row of " + std::to_string(length) + " tokens does not split into 2 x " +
                    std::to_string(cp_size) + " chunks for cp rank " + std::to_string(rank));
  }
  const int64_t chunk = length / (2 * cp_size);
  return at::cat({at::arange(rank * chunk, (rank + 1) * chunk, at::kLong),
                  at::arange((2 * cp_size - 1 - rank) * chunk, (2 * cp_size - rank) * chunk, at::kLong)});
}

models::CausalLMInput shard_sequence(const models::CausalLMInput& batch, int64_t cp_size, int64_t rank) {
  if (!batch.input_ids.defined() || batch.input_ids.dim() != 2) {
    throw UserError("shard_sequence: input_ids must be a tensor [batch, seq]");
  }
  if (batch.cache || batch.shard) throw UserError("shard_sequence: the batch must hold whole rows and no cache");
  const int64_t rows = batch.input_ids.size(0), length = batch.input_ids.size(1);
  const int64_t full = padded_length(length, cp_size);
  auto shard = std::make_shared<models::SequenceShard>();
  shard->full_length = full;
  shard->index = zigzag_index(full, cp_size, rank);
  const at::Tensor positions = batch.position_ids.defined()
                                   ? batch.position_ids
                                   : at::arange(length, at::kLong).view({1, length}).expand({rows, length}).contiguous();
  // Padding continues each row's positions, so it never starts a document.
  const at::Tensor padded_positions =
      full == length ? positions : at::cat({positions, positions.narrow(1, length - 1, 1) + at::arange(1, full - length + 1, at::kLong)}, 1);
  if (batch.document_mask && batch.position_ids.defined()) shard->documents = padded_positions.eq(0).cumsum(1);
  at::Tensor mask = batch.attention_mask;
  if (!mask.defined() && full != length) mask = at::ones({rows, length}, at::kLong);
  if (mask.defined()) {
    mask = pad_rows(mask, full, 0);
    if (!mask.all().item<bool>()) shard->valid = mask.to(at::kBool);  // all valid: no padding term in any block
  }
  models::CausalLMInput out;
  out.input_ids = pad_rows(batch.input_ids, full, 0).index_select(1, shard->index);
  out.position_ids = padded_positions.index_select(1, shard->index);
  if (mask.defined()) out.attention_mask = mask.index_select(1, shard->index);
  if (batch.labels.defined()) {
    // Next-token targets in the full row: position t predicts labels[t + 1].
    at::Tensor shifted = at::cat({batch.labels.narrow(1, 1, length - 1), at::full({rows, 1}, -100, batch.labels.options())}, 1);
    // A padding position predicts nothing (with left padding the last pad would otherwise
    // predict the first token from an attention over padding alone).
    if (batch.attention_mask.defined()) shifted = shifted.masked_fill(batch.attention_mask.eq(0), -100);
    out.labels = pad_rows(shifted, full, -100).index_select(1, shard->index);
  }
  out.document_mask = batch.document_mask;
  out.output_router_logits = batch.output_router_logits;
  out.shard = std::move(shard);
  return out;
}

}  // namespace hyperparallel::cp
