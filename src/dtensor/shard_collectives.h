// The per-axis moves of a redistribution on plain local tensors, one collective each, no
// autograd (redistribute.h wraps them). Every function returns a new tensor and leaves its
// input untouched; all of them accept uneven (ceil-split) shards.
//
// Uneven shards travel padded to the ceil chunk: with the ceil split only the trailing
// shards are short, so after an all-gather of padded chunks the first `size` rows are the
// tensor — no reordering. The padding is on the wire (as in PyTorch's DTensor) and counted.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "hyperparallel/comm/communicator.h"

namespace hyperparallel::dtensor {

// This rank's communicator on every axis of a mesh, in axis order.
struct AxisGroups {
  std::vector<std::shared_ptr<comm::Communicator>> comms;
  int64_t size(size_t axis) const { return comms[axis]->size(); }
  int64_t coord(size_t axis) const { return comms[axis]->rank(); }
  std::vector<int64_t> shape() const;
  std::vector<int64_t> coords() const;
};

// Shard(dim) -> Replicate: every rank's shard of a `size`-long dim, concatenated.
at::Tensor gather_shards(const at::Tensor& shard, int64_t dim, int64_t size, comm::Communicator& group);
// Partial(op) -> Shard(dim): this rank's shard of the reduction of every rank's tensor.
at::Tensor reduce_scatter_shards(const at::Tensor& full, int64_t dim, comm::ReduceOp op, comm::Communicator& group);
// Partial(op) -> Replicate.
at::Tensor all_reduce_copy(const at::Tensor& x, comm::ReduceOp op, comm::Communicator& group);
// Shard(from_dim) -> Shard(to_dim): `shard` holds this rank's piece of a `from_size`-long
// from_dim and the whole to_dim; the result holds the whole from_dim and this rank's piece
// of to_dim.
at::Tensor all_to_all_shards(const at::Tensor& shard, int64_t from_dim, int64_t from_size, int64_t to_dim,
                             comm::Communicator& group);
// Replicate -> Shard(dim): this rank's piece, no communication.
at::Tensor slice_shard(const at::Tensor& full, int64_t dim, comm::Communicator& group);
// Dim-0 rows: input_splits[k] rows go to rank k, output_splits[k] rows come from rank k.
at::Tensor all_to_all_rows(const at::Tensor& input, const std::vector<int64_t>& output_splits,
                           const std::vector<int64_t>& input_splits, comm::Communicator& group);

}  // namespace hyperparallel::dtensor
