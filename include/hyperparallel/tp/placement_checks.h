// Validation mode: the same tensor-parallel plan, run with every module boundary checked.
//
// Production mode (the default) runs the plan as plain local tensors and the collectives at
// module boundaries, nothing else. Validation mode (`parallelize_module(..., {.validate_placement
// = true})`, the trainer's `model.validate_placement`) runs the very same hooks and bodies —
// so the numbers are bit-identical — and in addition measures the placement of the tensors
// that cross each boundary (dtensor/placement_probe.h: one small all-gather per tensor) and
// checks it against two sources:
//   - the style's declared layouts, at its hook: what it assumes it receives and what it
//     hands on (ColwiseParallel's Replicate input, RowwiseParallel's Shard(-1) input, a
//     SequenceParallel norm's Shard(1) input, ...);
//   - the propagation rule of the op each module computes, from its parameters' specs:
//       linear      weight Shard(0): input Replicate; Shard(1): input Shard(-1); whole: input
//                   Replicate or sharded on a row dim (not the features, not Partial)
//       embedding   ids Replicate when the vocab is sharded; else Replicate or Shard
//       norm        normalises the last dim: input Replicate or sharded on another dim
//       attention, mlp, decoder layer: the residual add — the output must have the input's
//                   placement (Replicate, or the same Shard), never Partial
//       attention   softmax over every key: the hidden states its body projects are whole
//                   (Replicate); q/k/v outputs viewed as [.., heads, head_dim]: whole heads on
//                   every rank, and each rank's query heads a multiple of its kv heads (GQA)
//       cross-entropy  logits Replicate over the vocabulary, or Shard(-1) with loss parallel
// A mismatch is a UserError naming the module path, the style, the op, the expected and the
// actual placement, raised on every rank at once. Elementwise ops inside a body (the MLP's
// activation product, rotary, the attention's scaling) are covered by the rules of the
// modules around them, not checked one by one.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "hyperparallel/dtensor/placement_probe.h"
#include "hyperparallel/tp/parallel_styles.h"

namespace hyperparallel::tp {

// Where a check runs, for its message.
struct CheckSite {
  std::string path;   // "model.layers.0.mlp.down_proj"
  std::string style;  // "RowwiseParallel", or "no style" for a module the plan left whole
  std::string op;     // "linear", "embedding", "norm", "residual add", ...
};

// The op a module computes, by its kind.
std::string op_of(torch::nn::Module& module);

// Throws UserError unless `local` fits `expected` on ctx's tp group. `known` uses dims as a
// Python index would (-1: the last), converted for `local`.
void check_placement(const at::Tensor& local, const dtensor::Placement& expected, const dtensor::KnownSizes& known,
                     TensorParallelContext& ctx, const CheckSite& site, const std::string& role);

// Attaches the op-rule checks to every module under `root` (after the styles are applied:
// they read the parameters' layouts). Leaf ops are checked innermost (what the op computes
// on); blocks outermost (what their parent's residual add sees).
void attach_placement_checks(torch::nn::Module& root, std::shared_ptr<TensorParallelContext> ctx,
                             const ParameterLayouts& layouts);

}  // namespace hyperparallel::tp
