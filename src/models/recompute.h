// Activation recompute: a segment of the forward run without keeping its intermediate
// activations, run again in backward to get its gradients (activation checkpointing).
//
// LibTorch's C++ API has no saved-tensor hooks a C++ program can set (2.11's
// at::SavedTensorDefaultHooks takes Python objects), so this is the reentrant scheme of
// torch.utils.checkpoint: a custom autograd function whose forward runs the segment under
// no_grad and keeps only its input, and whose backward restores the CPU generator state of the
// forward, runs the segment again with grad on and backpropagates through it (a nested
// backward: parameter gradients accumulate as usual, so FSDP's gradient hooks fire), then
// returns the input's gradient. The segment may produce extra outputs (an MoE block's router
// logits, which the aux loss differentiates): they leave the function as outputs too, and
// their gradients enter the recomputed backward with the main output's.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace hyperparallel::models {

class ActivationSwapPool;

// The segment: input -> main output, appending any extra outputs to `extra`.
using RecomputedSegment = std::function<at::Tensor(const at::Tensor& input, std::vector<at::Tensor>* extra)>;

// Runs `segment` on `input` with recompute; appends its extra outputs to `extra` (when not
// null). The segment must capture what it needs by value: it runs again during backward.
//
// By default the rerun's backward is reentrant: the segment's parameters accumulate their
// gradients inside it, once per call. A parameter the segment shares with other uses — a tied
// head read by every chunk of a chunked loss and by the embedding — must instead be listed in
// `params`: its gradient is computed for the segment and handed back to autograd, which sums
// all uses and accumulates once (what fully_shard's gradient-ready hooks count on).
// With `swap` the input waits in that pool between forward and backward instead of being
// kept (activation_swap.h).
at::Tensor run_with_recompute(const at::Tensor& input, RecomputedSegment segment, std::vector<at::Tensor>* extra,
                              const std::vector<at::Tensor>& params = {}, std::shared_ptr<ActivationSwapPool> swap = nullptr);

// True while this thread reruns a segment in backward (e.g. so that counters count a forward
// once).
bool recomputing();

}  // namespace hyperparallel::models
