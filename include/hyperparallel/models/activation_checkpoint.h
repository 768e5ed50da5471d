// Activation checkpointing of a CausalLM's decoder layers, applied from outside.
//
//   models::apply_activation_checkpointing(*model, {"full", 2});  // layers 0, 2, 4, ...
//
// full: a checkpointed layer keeps only its input during forward and runs again in backward to get
// its gradients (src/models/recompute.h: the reentrant scheme, CPU generator state replayed,
// an MoE block's router logits kept differentiable for the aux loss). The numbers are those
// of the plain model; what changes is memory (the layer's intermediate activations are never
// all alive) and compute (one more forward of each checkpointed layer). Apply before or after
// fully_shard, tensor or expert parallelism, in any order: the recompute runs inside the
// layer's FSDP unit (its parameters are gathered for the backward anyway), and FSDP units
// nested in the layer (experts) treat a forward during backward as recompute — no prefetch,
// no reshard before their backward. Decoding with a KV cache and forwards without gradients
// are never checkpointed.
// selective: the layer is recomputed too, but less of it, under one of two policies:
//   op (the default; an op-level policy of torchtitan's kind): the layer also keeps the
//     output of every Linear in it (the projections, the MLP's and the experts' GEMMs, the
//     router) and the recompute reruns only the rest — norms, rotary, the attention core,
//     activations, routing — with no GEMM of a projection run twice
//     (src/models/linear_outputs.h). Any attention (plan overrides too).
//   attention_core (Megatron's selective recompute): only the attention core — scores, mask,
//     softmax, weighted values — is recomputed, from q, k and v kept packed; the
//     [heads x T x T] scores and probabilities, the term that grows with the square of the
//     sequence, are never kept, while projections, norms and MLPs keep their activations.
//     Needs the eager attention (a fused_qkv_attention override is a UserError).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hyperparallel::models {

class CausalLM;

struct ActivationCheckpointOptions {
  std::string mode = "full";  // off | full | selective
  int64_t every = 1;          // layers 0, every, 2·every, ...
  // full only: each checkpointed layer's saved input moves to a host pool after its forward
  // and comes back one layer ahead in backward (src/models/activation_swap.h). On this CPU
  // build host and device are one memory: the path is exercised and its traffic counted.
  bool swap_inputs = false;
  std::string selective_policy = "op";  // with mode selective: op | attention_core
};

// Returns the indices of the checkpointed layers (none with mode off). UserError for an
// unknown mode or selective policy, every < 1, or swap_inputs without mode full.
std::vector<int64_t> apply_activation_checkpointing(CausalLM& model, const ActivationCheckpointOptions& options);

// What activation swap moved so far (zeros without swap_inputs).
struct ActivationSwapTraffic {
  int64_t bytes_out = 0, bytes_in = 0;  // to the pool, back from it
  int64_t stashed = 0, prefetched = 0;  // inputs stashed; fetches served by a copy brought back ahead
};
ActivationSwapTraffic activation_swap_traffic(CausalLM& model);

}  // namespace hyperparallel::models
