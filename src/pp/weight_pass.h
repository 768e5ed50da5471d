// Zero-bubble's split backward without recomputation: the weight pass W starts where the
// input pass I left the weight gradients, not from the segment's outputs again.
//
// In a segment's autograd graph every parameter's gradient flows through a *junction*: the
// first node on the way up from the parameter (its gradient accumulator) that also leads to
// the segment's input — a linear layer's MmBackward, a norm's MulBackward, a fused node. I
// runs every junction (it is on the input gradient's path) but, asked only for the input's
// gradient, skips the junction's parameter-side outputs. SegmentWeights finds the junctions
// before I, captures the gradient that arrives at each during I (a post hook, removed after
// I) and in W re-runs only the junctions' parameter side from those gradients: for a linear
// layer dW = dYᵀX and nothing else, so I + W costs what B costs (PyTorch's
// stage_backward_input / stage_backward_weight do the same with GradientEdge, a Python
// wrapper over an autograd edge; in C++ this drives the engine with the edges directly).
//
// Parameters are grouped by shared junctions and each group runs as one engine call limited
// to the group's parameters, so a junction's input-side outputs (which lead to other
// parameters) are never needed. A group replays from the segment's outputs instead — exact,
// only slower — when a parameter also reaches an output without passing a junction, or when
// one of its junctions reaches another (a weight applied twice in sequence: the captured
// gradient at the earlier use already holds the later one's share).
//
// Gradient hooks W would skip — on the segment's outputs and on nodes inside it above the
// junctions (an FSDP unit's output inside a layer) — are called at the start of W with the
// gradients I saw there, so FSDP unshards and re-enters backward as it would for a full one.
//
// The captured gradients are held from I to W (one more tensor per junction: a linear
// layer's output gradient), the memory ZB trades for its bubble.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace hyperparallel::pp {

class SegmentWeights {
 public:
  // Reads the graph from `outputs` down to `input` (a leaf; undefined: no input, every group
  // replays) and `params`, and starts capturing at the junctions.
  SegmentWeights(const std::vector<at::Tensor>& outputs, const at::Tensor& input, const std::vector<at::Tensor>& params);
  ~SegmentWeights();
  SegmentWeights(SegmentWeights&&) noexcept;
  SegmentWeights& operator=(SegmentWeights&&) = delete;  // would leave the target's hooks attached

  // After I: removes the capture hooks (a later backward through the graph captures nothing).
  void stop_capture();
  // W: accumulates every parameter's gradient into its .grad; `output_grads` are the
  // gradients of the outputs given to the constructor. Fires, first, the gradient hooks W
  // would otherwise skip: the outputs' and those of hooked nodes inside
  // the segment above the junctions, with the gradients I saw there. A hook may see W's
  // gradient twice where a segment mixes direct and replayed groups (FSDP's are idempotent).
  void accumulate(const std::vector<at::Tensor>& output_grads);

  int64_t direct_groups() const;    // groups that start at their junctions
  int64_t replayed_groups() const;  // groups that replay from the outputs

 private:
  struct Capture;
  struct Group;
  void run_from_junctions(Group& group);
  void replay(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& output_grads);

  std::vector<at::Tensor> outputs_;
  std::vector<Group> groups_;
  std::vector<Capture> hooked_;  // hooked input-path nodes W does not run, for their hooks
};

// Runs `body` inside one autograd engine task, so that hooks which queue an end-of-backward
// callback (FSDP's) see one backward however many engine calls the body makes.
void run_as_one_backward(const std::function<void()>& body);

}  // namespace hyperparallel::pp
