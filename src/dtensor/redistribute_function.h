// The one autograd function under every redistribution and every differentiable
// collective: forward moves a local tensor from one placement list to another
// (redistribute_local.h); backward moves the gradient from the output's gradient
// placements back to the input's.
//
// Gradient placements (docs/dtensor.md "Gradients"): every local gradient is the literal
// derivative of the job's loss by that local tensor. The gradient of a Shard or Replicate
// tensor has the same placement; the gradient of a Partial(sum) tensor is Replicate (each
// local term enters the sum with weight 1); that of a Partial(avg) tensor is Replicate
// divided by the axis size. A caller can declare that the output's gradient arrives as
// Partial instead — what a replicated activation feeding a column-parallel matmul gets —
// and the backward then reduces it (Megatron's "f" and the sequence-parallel all-gather
// whose backward is a reduce-scatter).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "hyperparallel/dtensor/placement.h"
#include "shard_collectives.h"

namespace hyperparallel::dtensor {

struct RedistributeCall {
  AxisGroups axes;
  std::vector<int64_t> global_shape;
  Placements from;
  Placements to;
  std::optional<Placements> grad_of_output;  // default: `to` with Partial -> Replicate
};

// Differentiable: the result's gradient flows back to `local` as described above.
at::Tensor redistribute_differentiable(const at::Tensor& local, RedistributeCall call);

// `placements` with every Partial replaced by Replicate: the placements of a gradient.
Placements gradient_placements(const Placements& placements);

}  // namespace hyperparallel::dtensor
