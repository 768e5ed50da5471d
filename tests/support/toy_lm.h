// ToyLM: a transformer-shaped model without attention for FSDP tests and benchmarks —
// embedding, blocks of (norm scale, Linear, tanh, Linear, residual), a final norm scale and a
// head tied to the embedding. Every module goes through the fully_shard hook point; blocks
// pass their input through it so mixed precision can cast it.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>
#include <vector>

#include "hyperparallel/fsdp/module_hooks.h"

namespace hyperparallel::testing {

struct ToyBlock : torch::nn::Module {
  ToyBlock(int64_t dim, int64_t hidden) {
    norm = register_parameter("norm", at::ones({dim}));
    fc1 = register_module("fc1", torch::nn::Linear(dim, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, dim));
  }
  at::Tensor forward(const at::Tensor& x) {
    return fsdp::hooked_forward(*this, x, [&](const at::Tensor& x) { return x + fc2(at::tanh(fc1(x * norm))); });
  }
  at::Tensor norm;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

struct ToyLM : torch::nn::Module {
  ToyLM(int64_t vocab, int64_t dim, int64_t hidden, int64_t layers) {
    embed = register_module("embed", torch::nn::Embedding(vocab, dim));
    for (int64_t i = 0; i < layers; ++i) {
      blocks.push_back(register_module("layers" + std::to_string(i), std::make_shared<ToyBlock>(dim, hidden)));
    }
    final_norm = register_parameter("final_norm", at::ones({dim}));
  }
  at::Tensor forward(const at::Tensor& tokens) {
    return fsdp::hooked_forward(*this, [&] {
      at::Tensor h = embed(tokens);
      for (auto& b : blocks) h = b->forward(h);
      return at::matmul(h * final_norm, embed->weight.t());  // head tied to the embedding
    });
  }
  torch::nn::Embedding embed{nullptr};
  std::vector<std::shared_ptr<ToyBlock>> blocks;
  at::Tensor final_norm;
};

}  // namespace hyperparallel::testing
