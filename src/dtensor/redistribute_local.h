// The redistribution algorithm on plain local tensors (no autograd): from one list of
// placements to another on an N-D mesh, as a sequence of per-axis moves
// (shard_collectives.h). docs/dtensor.md "Redistribution" explains the order:
//  1. un-shard, innermost axis first: a Shard axis whose piece changes is all-gathered
//     (or all-to-all'ed to its new dim when no other axis shards either dim) — an axis
//     nested inside one that changes on the same dim changes too;
//  2. reduce Partial axes: reduce-scatter straight into the target shard when the nesting
//     allows, else all-reduce;
//  3. shard, outermost axis first: local slices for new Shard axes, and Replicate ->
//     Partial(sum) keeps the value on coordinate 0 and zeros elsewhere (exact, unlike a
//     division by the axis size); Replicate -> Partial(avg) keeps it everywhere.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "hyperparallel/dtensor/placement.h"
#include "shard_collectives.h"

namespace hyperparallel::dtensor {

// `local` is this rank's piece of a `global_shape` tensor under `from`; returns its piece
// under `to`. May return `local` itself when nothing changes.
at::Tensor redistribute_local(const at::Tensor& local, const AxisGroups& axes, const std::vector<int64_t>& global_shape,
                              const Placements& from, const Placements& to);

}  // namespace hyperparallel::dtensor
