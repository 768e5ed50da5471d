// Differentiable collectives on plain tensors over one communicator: what TP, SP, EP and CP
// call at module boundaries in Production mode. Each returns a new tensor (inputs are never
// written) and its backward is the dual collective:
//
//   forward                               backward (of the gradient)
//   all_gather_into(x, dim)   S(dim)->R   reduce-scatter (default) or slice (GradIs::kReplicate)
//   reduce_scatter(x, dim)    P->S(dim)   all-gather
//   all_reduce(x)             P->R        identity (Megatron's "g"); all-reduce with kPartial
//   reduce_grad(x)            R->R        all-reduce (Megatron's "f": identity forward)
//   local_shard(x, dim)       R->S(dim)   all-gather (this rank's slice, no communication)
//   all_to_all(x, splits)     rows        all-to-all with the splits swapped
//
// They are the one-axis case of DTensor::redistribute and share its code
// (src/dtensor/redistribute_function.h). Uneven shards use the ceil split (placement.h);
// all_to_all takes any splits.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "hyperparallel/comm/communicator.h"

namespace hyperparallel::dtensor {

// How the gradient of a collective's replicated result arrives: kPartial when each rank's
// gradient is one term of a sum (the result feeds sharded work), kReplicate when every rank
// holds the whole gradient (the result feeds replicated work).
enum class GradIs { kPartial, kReplicate };

struct AllGatherOptions {
  int64_t global_size = -1;  // the gathered length of `dim`; -1: local length x group size
  GradIs grad = GradIs::kPartial;
};

at::Tensor all_gather_into(const at::Tensor& x, int64_t dim, comm::Communicator& group,
                           const AllGatherOptions& options = {});
at::Tensor reduce_scatter(const at::Tensor& x, int64_t dim, comm::Communicator& group,
                          comm::ReduceOp op = comm::ReduceOp::kSum);
at::Tensor all_reduce(const at::Tensor& x, comm::Communicator& group, comm::ReduceOp op = comm::ReduceOp::kSum,
                      GradIs grad = GradIs::kReplicate);
at::Tensor reduce_grad(const at::Tensor& x, comm::Communicator& group);
at::Tensor local_shard(const at::Tensor& x, int64_t dim, comm::Communicator& group);
// Rows of dim 0: input_splits[k] rows go to rank k, output_splits[k] come from rank k.
at::Tensor all_to_all(const at::Tensor& x, comm::Communicator& group, const std::vector<int64_t>& output_splits,
                      const std::vector<int64_t>& input_splits);

}  // namespace hyperparallel::dtensor
