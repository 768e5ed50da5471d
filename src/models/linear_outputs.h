// Selective activation checkpointing's op-level policy: a checkpointed layer keeps its input and
// the output of every Linear in it, and recomputes the rest — norms, rotary, the attention core
// (scores, softmax), activations, the router's softmax — in backward, without running a
// projection's GEMM a second time. (torchtitan's "op" policy is of the same kind but keeps every
// other matmul's output, the fused attention's and reduce-scatter results, recomputing the
// other matmuls.)
//
// LibTorch's C++ API has no saved-tensor hooks or dispatch modes a C++ program can set (in
// 2.11 both hold Python objects), so the policy lives in
// Linear itself: while a LinearOutputScope is open on this thread, Linear's body goes through
// linear_with_kept_outputs. In the layer's forward (run under no_grad by the recompute
// function, recompute.h) each output is appended to the scope's KeptLinearOutputs; in the
// recompute the Linears run again in the same order and each gets its kept output back through
// a custom autograd function whose backward is the linear's own (dX = dY W, dW = dYᵀ X,
// db = Σ dY, the products autograd's mm backward computes), so the recompute builds the graph
// that backward needs while no forward GEMM runs again. A kept output is handed back once and
// then dropped; a second recompute (or one that finds none left) computes the linear plainly.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

namespace hyperparallel::models {

// One checkpointed forward's Linear outputs, in call order, each with the module that made it.
struct KeptLinearOutputs {
  struct Kept {
    at::Tensor output;  // undefined once handed back
    const void* site;
  };
  std::vector<Kept> outputs;
  size_t next = 0;  // the next one a recompute takes
};

// While alive, Linear layers on this thread record into `kept` (kRecord: the forward) or take
// from it (kReplay: the recompute). Scopes nest; the innermost applies.
class LinearOutputScope {
 public:
  enum class Mode { kRecord, kReplay };
  LinearOutputScope(KeptLinearOutputs& kept, Mode mode);
  ~LinearOutputScope();
  LinearOutputScope(const LinearOutputScope&) = delete;
  LinearOutputScope& operator=(const LinearOutputScope&) = delete;

  KeptLinearOutputs& kept;
  const Mode mode;

 private:
  LinearOutputScope* outer_;
};

// at::linear(x, weight, bias), recorded or replayed by the open scope (plain without one).
// `site` names the calling module: a replay checks that the output it hands back was made
// there (std::logic_error otherwise: the recompute took another path than the forward).
at::Tensor linear_with_kept_outputs(const void* site, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace hyperparallel::models
