// FusedSwiGLUMlp: the gated MLP, down_proj(silu(gate_proj(x)) * up_proj(x)), with the
// elementwise part as one pass each way (a custom autograd function) instead of SiLU, its
// backward and two multiplies with their [tokens x intermediate] temporaries.
//  - forward: h = g * sigmoid(g) * u, read once, written once;
//  - backward: du = dh * silu(g) and dg = dh * u * sigmoid(g) * (1 + g (1 - sigmoid(g))) in one
//    pass, the sigmoid recomputed;
//  - it keeps g and u for backward (the reference keeps g, silu(g) and u);
//  - fp32 math on vector_lanes.h's widest vectors; bf16 is read and written as it is and rounded
//    once (the reference rounds silu(g) and again its product with u). In bf16 the elementwise
//    ops of the reference ran at a fifth of their fp32 speed here (docs/benchmarks.md).
// The projections stay the original's Linear modules (same tensors, same names), called
// through their forward: tensor parallelism, FSDP and the op checkpointing policy see them as
// before. fp32 results equal the reference's to float rounding (its exp is Cephes', within
// 2 ulp of expf); other dtypes and devices take the reference's ops.
#pragma once

#include <memory>

#include "hyperparallel/models/model_config.h"
#include "layers.h"

namespace hyperparallel::models {

// silu(gate) * up, fused as above (same shapes; any other case: ATen's ops).
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);
// The kernels at a given vector width (16, 8 or 4; 0: the widest this CPU runs), for tests:
// h = silu(g) * u; dg, du from dh. fp32 pointers, n elements.
void swiglu_forward(const float* g, const float* u, float* h, int64_t n, int lanes = 0);
void swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du, int64_t n, int lanes = 0);

class FusedSwiGLUMlp : public FeedForwardModule {
 public:
  explicit FusedSwiGLUMlp(Mlp& original);
  at::Tensor forward(const at::Tensor& x, std::vector<at::Tensor>* router_logits = nullptr) override;

 private:
  std::shared_ptr<Linear> gate_proj_, up_proj_, down_proj_;
};

// plan_overrides factory: replaces any Mlp (UserError for other module types).
std::shared_ptr<torch::nn::Module> make_fused_swiglu_mlp(torch::nn::Module& original, const ModelConfig& config);

}  // namespace hyperparallel::models
