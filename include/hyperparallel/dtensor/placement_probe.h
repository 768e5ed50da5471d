// What placement a local tensor really has on a group: the measurement behind Validation mode.
//
// observe_layout() all-gathers, in one small collective, every rank's shape and two float64
// fingerprints of its values (a plain and a position-weighted sum). From that it knows whether
// the ranks hold the same bits (Replicate), the same shape with different values (what
// Partial — or a diverged replica — looks like), or pieces of one dim (Shard). Every rank gets
// the same observation, so every rank reaches the same verdict: a failed check throws on all
// of them together and nothing hangs.
//
// A check needs what the plan knows about the global tensor: `known_sizes` maps a dim to its
// global length (the features a layer expects, a sequence a hook sharded); dims not in it are
// read from the shapes. Limits, written down: a shard whose pieces happen to be bit-identical
// on every rank reads as Replicate, and a Partial whose terms are equal reads as Replicate
// (fits() accepts that for Partial).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/dtensor/placement.h"

namespace hyperparallel::dtensor {

using KnownSizes = std::map<int64_t, int64_t>;  // dim (>= 0) -> global length

struct ObservedLayout {
  std::vector<std::vector<int64_t>> shapes;  // per rank, in group order
  bool same_shapes = false;
  bool same_values = false;                  // same shapes and same fingerprints

  // Whether the ranks' pieces are `expected` of a tensor with the known global sizes.
  bool fits(const Placement& expected, const KnownSizes& known) const;
  // What the pieces look like: "Replicate() (the same [2, 8, 64] on every rank)",
  // "Shard(2) (32 of 64 on each rank, shape [2, 8, 32])", "Partial(sum) or diverged (...)".
  std::string describe(const KnownSizes& known) const;
};

ObservedLayout observe_layout(const at::Tensor& local, comm::Communicator& group);

}  // namespace hyperparallel::dtensor
