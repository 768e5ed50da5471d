// Attention kernels of context parallelism on blocks of a row's tokens, with masks built per
// block from a models::SequenceShard (nothing [L x L]).
//
// Every token sequence here is a list of chunks of `chunk` consecutive full-row indices (the
// zigzag layout, cp/context_parallel.h), described by each chunk's first index. Query heads
// are grouped by their kv head ([B, H_kv, G * T, D]) so grouped kv heads are never repeated.
//  - causal_attention: queries against every key of the row in natural order, one softmax per
//    query chunk over the keys up to its end — as transformers' eager attention computes it
//    (scores scaled, additive mask of the dtype's lowest value, softmax in fp32). In fp32 each
//    chunk goes through the models' tiled kernel (models/causal_attention.h: the keys before
//    the chunk are its cached "past"), else plain autograd. Used by Ulysses and all-gather.
//  - BlockSoftmax: one (query chunk, key chunk) block of an online softmax (ring attention):
//    scores in fp32 with -inf where masked, folded into a running max, sum and output; and
//    the same block's backward from the saved log-sum-exp.
#pragma once

#include <ATen/ATen.h>

#include <utility>
#include <vector>

#include "hyperparallel/models/module_interfaces.h"

namespace hyperparallel::cp {

// Which of keys k_index [Tk] queries q_index [Tq] may see: [B or 1, 1, Tq, Tk] bool.
at::Tensor visible_keys(const models::SequenceShard& shard, const at::Tensor& q_index, const at::Tensor& k_index);

// q [B, H, n * chunk, D] (chunks at q_starts); k, v [B, H_kv, L, D] in natural order.
// Returns [B, H, n * chunk, D].
at::Tensor causal_attention(const at::Tensor& q, const std::vector<int64_t>& q_starts, const at::Tensor& k, const at::Tensor& v,
                            int64_t chunk, const models::SequenceShard& shard, double scaling);

// How a key chunk relates to a query chunk under the causal rule.
enum class BlockKind { kHidden, kDiagonal, kBelow };  // kHidden: every key after every query
BlockKind block_kind(int64_t q_start, int64_t k_start);

// The running state of one query chunk's online softmax, all fp32: out [B, H_kv, G*c, D]
// (unnormalised), row max and row sum [B, H_kv, G*c, 1].
struct SoftmaxState {
  at::Tensor out, max, sum;
};

// Folds key chunk (k, v [B, H_kv, c, D]) into `state` for query chunk qg [B, H_kv, G*c, D];
// `visible` [B|1, 1, c, c] or undefined (every key visible).
void fold_block(SoftmaxState& state, const at::Tensor& qg, const at::Tensor& k, const at::Tensor& v, const at::Tensor& visible,
                int64_t groups, double scaling);
// The normalised output and log-sum-exp (-inf for a row that saw no key; its output is 0).
std::pair<at::Tensor, at::Tensor> finish(const SoftmaxState& state);

// Gradient contributions of one block: dq [B, H_kv, G*c, D] and dk, dv [B, H_kv, c, D] added
// into the given accumulators. `delta` = rowsum(d_out * out) [B, H_kv, G*c, 1].
void block_backward(const at::Tensor& qg, const at::Tensor& k, const at::Tensor& v, const at::Tensor& visible, const at::Tensor& lse,
                    const at::Tensor& d_out, const at::Tensor& delta, int64_t groups, double scaling, at::Tensor& dq, at::Tensor& dk,
                    at::Tensor& dv);

// q [B, H, T, D] as [B, H_kv, G * T, D] and back.
at::Tensor group_queries(const at::Tensor& q, int64_t kv_heads);
at::Tensor ungroup_queries(const at::Tensor& qg, int64_t heads);

}  // namespace hyperparallel::cp
