// Context parallelism: the sequence of every row split over the ranks of a `cp` group, so
// attention over long sequences needs 1/cp of the activations per rank.
//
// Layout (causal load balancing): a row of L tokens (padded to a multiple of 2·cp) is cut into
// 2·cp chunks of c = L / (2·cp); cp rank i holds chunks i and 2·cp-1-i, in that order
// (zigzag), so every rank does the same causal attention work. shard_sequence() makes a rank's
// input from a whole batch: ids, positions (the global ones, so rotary tables follow),
// attention mask and the labels, shifted to next-token targets in the full row before they
// are split. The model sees a models::SequenceShard (global indices, document ids from the
// global positions, padding) instead of a dense mask, and every attention goes through the
// core parallelize_context() installs:
//
//   ulysses    all-to-all from sequence- to head-sharded q, k, v (heads and kv heads divide
//              by the degree), local attention over the whole row, all-to-all back:
//              4 all-to-alls forward and 4 backward per layer.
//   allgather  K and V all-gathered (backward reduce-scatters dK, dV); each rank attends with
//              its own queries over the keys at or before them.
//   ring       K/V blocks passed peer to peer around the ring, each merged with an online
//              softmax (running max and log-sum-exp), the next transfer in flight while the
//              current block computes; causal blocks entirely above the diagonal are skipped.
//              Backward runs the ring again: K/V forward (cp-1 transfers) and each block's
//              dK/dV accumulating as it travels back home (cp transfers). Only q, k, v, the
//              output and the log-sum-exp are kept: nothing [T x T] survives the forward.
//   hybrid     ulysses over groups of `ulysses_degree` consecutive cp ranks, then ring (or
//              allgather, with algorithm allgather and ulysses_degree > 1) over the rest.
//
// Inputs with whole rows (no shard: generation, evaluation) keep the model's local attention.
// FSDP goes over the flattened dp_shard x cp ranks: cp ranks hold the same parameters and
// their gradients add up, the loss being the sum over every shard's label tokens divided by
// their global count. Exactness: equal to the one-process model up to float rounding (sums in
// another order), tested at 1e-5 relative over 20 training steps.
#pragma once

#include <memory>
#include <string>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/cp/cp_options.h"
#include "hyperparallel/models/causal_lm.h"

namespace hyperparallel::cp {

// Installs the context-parallel attention over `cp` on `model` (CausalLM::set_attention_core).
// UserError for an unknown algorithm or a degree that does not fit the group or the model's
// (this rank's) heads, naming the valid degrees.
void parallelize_context(models::CausalLM& model, std::shared_ptr<comm::Communicator> cp, const ContextParallelOptions& options);

// Rows padded to a multiple of 2·cp_size.
int64_t padded_length(int64_t length, int64_t cp_size);

// [2c] the full-row indices cp rank `rank` holds in a row of `length` (a multiple of 2·cp_size).
at::Tensor zigzag_index(int64_t length, int64_t cp_size, int64_t rank);

// This cp rank's input from a whole batch (input_ids required; labels, attention_mask and
// position_ids optional as for CausalLM::forward). Rows are padded at the end (padding token
// id 0, masked out, labels -100), so the loss over the shards is the loss over the batch.
// Padding positions predict nothing: their next-token targets become -100. (The unsharded
// model differs only for left padding, where its last pad predicts the first token from an
// attention over padding alone: a query row with no visible key is uniform over the row
// there, zero under ring attention, so it must not carry a loss.)
models::CausalLMInput shard_sequence(const models::CausalLMInput& batch, int64_t cp_size, int64_t rank);

}  // namespace hyperparallel::cp
