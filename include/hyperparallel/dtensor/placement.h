// Placement: how a tensor lives on one mesh axis — Shard(dim), Replicate() or Partial(op) —
// and the shard arithmetic every layer shares.
//
// Shard(d): the ranks of the axis hold consecutive pieces of tensor dim d, split by ceil:
// rank k of n holds [k·c, min((k+1)·c, size)) with c = ceil(size / n), so the last shards
// may be shorter or empty (size 5 over 4 ranks: 2, 2, 1, 0). FSDP uses the same split.
// Replicate(): every rank holds the whole value. Partial(sum|avg): every rank holds a
// tensor of the full shape and the value is their sum (or mean) — what a row-parallel
// matmul produces before its all-reduce.
// On an N-D mesh a spec has one placement per axis; when several axes shard the same dim
// the split nests in axis order (axis 0 splits first, axis 1 splits that piece): local_box()
// computes any rank's piece. See docs/dtensor.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hyperparallel/comm/communicator.h"

namespace hyperparallel::dtensor {

class Placement {
 public:
  enum class Kind { kShard, kReplicate, kPartial };

  static Placement shard(int64_t dim) { return Placement(Kind::kShard, dim, comm::ReduceOp::kSum); }
  static Placement replicate() { return Placement(Kind::kReplicate, -1, comm::ReduceOp::kSum); }
  // op: kSum or kAvg.
  static Placement partial(comm::ReduceOp op = comm::ReduceOp::kSum);

  Kind kind() const { return kind_; }
  bool is_shard() const { return kind_ == Kind::kShard; }
  bool is_shard(int64_t dim) const { return kind_ == Kind::kShard && dim_ == dim; }
  bool is_replicate() const { return kind_ == Kind::kReplicate; }
  bool is_partial() const { return kind_ == Kind::kPartial; }
  int64_t dim() const { return dim_; }                  // Shard only
  comm::ReduceOp reduce_op() const { return op_; }      // Partial only

  std::string to_string() const;  // "Shard(0)", "Replicate()", "Partial(sum)"
  bool operator==(const Placement& other) const;
  bool operator!=(const Placement& other) const { return !(*this == other); }

 private:
  Placement(Kind kind, int64_t dim, comm::ReduceOp op) : kind_(kind), dim_(dim), op_(op) {}
  Kind kind_;
  int64_t dim_;
  comm::ReduceOp op_;
};

// Spelled as in PyTorch, so plans read like theirs: {Shard(0), Replicate()}.
inline Placement Shard(int64_t dim) { return Placement::shard(dim); }
inline Placement Replicate() { return Placement::replicate(); }
inline Placement Partial(comm::ReduceOp op = comm::ReduceOp::kSum) { return Placement::partial(op); }

using Placements = std::vector<Placement>;
std::string to_string(const Placements& placements);  // "[Shard(0), Replicate()]"
std::string shape_string(const std::vector<int64_t>& shape);  // "[5, 7]", for messages

// The ceil split of `size` over `n` ranks: the length and first index of rank k's shard.
int64_t shard_length(int64_t size, int64_t n, int64_t k);
int64_t shard_offset(int64_t size, int64_t n, int64_t k);

// One rank's piece of a tensor: [offsets[d], offsets[d] + lengths[d]) on every dim.
struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> lengths;
  bool operator==(const Box& other) const { return offsets == other.offsets && lengths == other.lengths; }
};

// The piece of a `global_shape` tensor held by the rank at `coords` of a mesh of
// `mesh_shape` under `placements` (nested in axis order). Partial and Replicate axes do not
// split. Throws UserError when the sizes disagree or a Shard dim is out of range.
Box local_box(const std::vector<int64_t>& global_shape, const Placements& placements,
              const std::vector<int64_t>& mesh_shape, const std::vector<int64_t>& coords);

// Checks that `placements` fit a tensor of `tensor_dims` dims on a mesh of `mesh_axes` axes;
// `what` names the tensor in the message ("parameter 'model.embed_tokens.weight'").
void check_placements(const Placements& placements, int64_t tensor_dims, int64_t mesh_axes, const std::string& what);

}  // namespace hyperparallel::dtensor
