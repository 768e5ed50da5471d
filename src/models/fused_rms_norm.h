// FusedRMSNorm: RMSNorm as one pass over each row, forward and backward (a custom autograd
// function), instead of the seven tensor operations and temporaries of the reference; its row
// kernels are compiled per instruction set and picked at load (fused_rms_norm.cpp).
// It adopts the original norm's weight (same tensor, same name) and, for fp32 inputs and
// weights, computes the same function to rounding; bf16 runs the fp32 kernels between casts
// (agreeing with the reference to bf16 rounding); other dtypes take the reference path.
#pragma once

#include <memory>

#include "hyperparallel/models/model_config.h"
#include "layers.h"

namespace hyperparallel::models {

class FusedRMSNorm : public NormModule {
 public:
  explicit FusedRMSNorm(const RMSNorm& original);
  at::Tensor forward(const at::Tensor& x) override;
  at::Tensor weight;
  double eps;
};

// plan_overrides factory: replaces any RMSNorm (UserError for other module types).
std::shared_ptr<torch::nn::Module> make_fused_rms_norm(torch::nn::Module& original, const ModelConfig& config);

}  // namespace hyperparallel::models
