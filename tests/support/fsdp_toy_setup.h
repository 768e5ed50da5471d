// The FSDP suites' shared setup (fsdp_parity_test.cpp, fsdp_shards_test.cpp): a ToyLM whose
// dims do not divide by 3 or 4, its seeded weights, the global batch of each step (tokens and
// next-token targets), the loss and the AdamW the single-process reference uses too.
#pragma once

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <memory>
#include <utility>

#include "support/toy_lm.h"

namespace hyperparallel::testing::fsdp_toy {

inline constexpr int64_t kVocab = 37, kDim = 24, kHidden = 40, kLayers = 3, kSeq = 8, kBatch = 12;

using TinyLM = ToyLM;

inline std::shared_ptr<TinyLM> make_model(bool freeze_final_norm = false) {
  at::manual_seed(1234);
  auto model = std::make_shared<TinyLM>(kVocab, kDim, kHidden, kLayers);
  if (freeze_final_norm) model->final_norm.set_requires_grad(false);
  return model;
}

// The global batch of step `step`: tokens and next-token targets.
inline std::pair<at::Tensor, at::Tensor> global_batch(int step) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(77 + step));
  at::Tensor seq = at::randint(0, kVocab, {kBatch, kSeq + 1}, gen, at::TensorOptions().dtype(at::kLong));
  return {seq.narrow(1, 0, kSeq).contiguous(), seq.narrow(1, 1, kSeq).contiguous()};
}

inline at::Tensor loss_of(TinyLM& model, const at::Tensor& tokens, const at::Tensor& targets) {
  return at::cross_entropy_loss(model.forward(tokens).reshape({-1, kVocab}), targets.reshape({-1}));
}

inline torch::optim::AdamW make_optimizer(TinyLM& model) {
  return torch::optim::AdamW(model.parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
}

}  // namespace hyperparallel::testing::fsdp_toy
