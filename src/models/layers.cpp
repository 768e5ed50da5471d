// Linear, Embedding, RMSNorm, Mlp and their parameter factory. See layers.h.
#include "layers.h"

#include <ATen/CPUGeneratorImpl.h>

namespace hyperparallel::models {

ParamFactory::ParamFactory(bool deferred, uint64_t seed, double init_std, at::ScalarType dtype)
    : deferred_(deferred), generator_(at::detail::createCPUGenerator(seed)), init_std_(init_std), dtype_(dtype) {}

at::Tensor ParamFactory::make(at::IntArrayRef shape) { return at::empty(shape, at::TensorOptions().dtype(dtype_)); }

at::Tensor ParamFactory::normal(at::IntArrayRef shape) {
  at::Tensor t = make(shape);
  if (deferred_) return t;
  // Drawn in fp32 (the generator's stream does not depend on the storage dtype), then cast.
  at::Tensor values = at::empty(shape, at::kFloat);
  values.normal_(0.0, init_std_, generator_);
  return t.copy_(values);
}

at::Tensor ParamFactory::ones(at::IntArrayRef shape) { return deferred_ ? make(shape) : make(shape).fill_(1.0); }
at::Tensor ParamFactory::zeros(at::IntArrayRef shape) { return deferred_ ? make(shape) : make(shape).zero_(); }

Linear::Linear(int64_t in, int64_t out, bool with_bias, ParamFactory& factory) : torch::nn::Module("Linear") {
  weight = register_parameter("weight", factory.normal({out, in}));
  if (with_bias) bias = register_parameter("bias", factory.zeros({out}));
}

Embedding::Embedding(int64_t vocab, int64_t dim, ParamFactory& factory) : torch::nn::Module("Embedding") {
  weight = register_parameter("weight", factory.normal({vocab, dim}));
}

RMSNorm::RMSNorm(const std::string& type_name, int64_t dim, double eps_, ParamFactory& factory)
    : NormModule(type_name), eps(eps_) {
  weight = register_parameter("weight", factory.ones({dim}));
}

at::Tensor RMSNorm::forward(const at::Tensor& x) {
  const at::Tensor h = x.to(at::kFloat);
  const at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (h * at::rsqrt(variance + eps)).to(x.scalar_type());
}

Mlp::Mlp(const std::string& type_name, int64_t hidden, int64_t intermediate, bool bias, ParamFactory& factory)
    : FeedForwardModule(type_name) {
  gate_proj = register_module("gate_proj", std::make_shared<Linear>(hidden, intermediate, bias, factory));
  up_proj = register_module("up_proj", std::make_shared<Linear>(hidden, intermediate, bias, factory));
  down_proj = register_module("down_proj", std::make_shared<Linear>(intermediate, hidden, bias, factory));
}

at::Tensor Mlp::forward(const at::Tensor& x, std::vector<at::Tensor>*) {
  return down_proj->forward(at::silu(gate_proj->forward(x)) * up_proj->forward(x));
}

}  // namespace hyperparallel::models
