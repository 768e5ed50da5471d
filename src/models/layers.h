// The building blocks of the decoder models: Linear, Embedding, RMSNorm, the SwiGLU MLP, and
// ParamFactory, which decides how their parameters come into being.
//
// Parameters are created by a ParamFactory: either initialised as Hugging Face's
// _init_weights does (normal(0, initializer_range) for matrices, ones for norms, zeros for
// biases) from one seeded generator in construction order — deterministic for a seed — or
// deferred: storage reserved but never written, so the OS backs no page of it until a
// loader (or fully_shard, for its shard only) writes it. Each module computes exactly what
// the matching transformers module computes in eager mode.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hyperparallel/models/module_interfaces.h"
#include "hyperparallel/nn/forward_hooks.h"
#include "linear_outputs.h"

namespace hyperparallel::models {

class ParamFactory {
 public:
  ParamFactory(bool deferred, uint64_t seed, double init_std, at::ScalarType dtype);
  at::Tensor normal(at::IntArrayRef shape);
  at::Tensor ones(at::IntArrayRef shape);
  at::Tensor zeros(at::IntArrayRef shape);

 private:
  at::Tensor make(at::IntArrayRef shape);
  bool deferred_;
  at::Generator generator_;
  double init_std_;
  at::ScalarType dtype_;
};

class Linear : public torch::nn::Module {
 public:
  Linear(int64_t in, int64_t out, bool bias, ParamFactory& factory);
  at::Tensor forward(const at::Tensor& x) {
    // Through the selective checkpointing scope when one is open (linear_outputs.h).
    return nn::run_with_hooks(*this, x, [this](const at::Tensor& in) { return linear_with_kept_outputs(this, in, weight, bias); });
  }
  at::Tensor weight, bias;  // bias undefined when absent
};

class Embedding : public torch::nn::Module {
 public:
  Embedding(int64_t vocab, int64_t dim, ParamFactory& factory);
  at::Tensor forward(const at::Tensor& ids) {
    return nn::run_with_hooks(*this, ids, [this](const at::Tensor& in) { return at::embedding(weight, in); });
  }
  at::Tensor weight;
};

// y = weight * (x / sqrt(mean(x^2) + eps)), the statistic in fp32, as transformers' RMSNorm.
class RMSNorm : public NormModule {
 public:
  RMSNorm(const std::string& type_name, int64_t dim, double eps, ParamFactory& factory);
  at::Tensor forward(const at::Tensor& x) override;
  at::Tensor weight;
  double eps;
};

// down_proj(silu(gate_proj(x)) * up_proj(x)).
class Mlp : public FeedForwardModule {
 public:
  Mlp(const std::string& type_name, int64_t hidden, int64_t intermediate, bool bias, ParamFactory& factory);
  at::Tensor forward(const at::Tensor& x, std::vector<at::Tensor>* router_logits = nullptr) override;
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
};

}  // namespace hyperparallel::models
