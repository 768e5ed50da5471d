// Parity records and their comparison. See parity_run.h.
#include "support/parity_run.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <cmath>

#include "hyperparallel/fsdp/clip_grad_norm.h"
#include "hyperparallel/fsdp/fully_shard.h"

namespace hyperparallel::testing {

void record_step(ParityRun& run, const RankContext* ctx, torch::nn::Module& model, const at::Tensor& loss, double copies) {
  at::Tensor total = loss.detach().reshape({1}).to(at::kDouble).clone();
  if (ctx) {
    run.grad_norms.push_back(fsdp::clip_grad_norm_(model, 0, *ctx->world));
    ctx->world->all_reduce(total).wait();
    total /= copies;
  } else {
    at::Tensor sq = at::zeros({}, at::kDouble);
    for (const auto& p : model.parameters()) {
      if (p.grad().defined()) sq += p.grad().to(at::kDouble).pow(2).sum();
    }
    run.grad_norms.push_back(std::sqrt(sq.item<double>()));
  }
  run.losses.push_back(total.item<double>());
}

void record_parameters(ParityRun& run, const RankContext* ctx, torch::nn::Module& model) {
  if (ctx) {
    run.params = fsdp::full_state_dict(model);
    return;
  }
  for (const auto& item : model.named_parameters()) run.params[item.key()] = item.value().detach().clone();
}

void expect_same_training(const ParityRun& ref, const ParityRun& got, double tolerance,
                          const std::function<bool(const std::string&)>& compare) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], ref.losses[s], tolerance * std::abs(ref.losses[s])) << "step " << s;
    EXPECT_NEAR(got.grad_norms[s], ref.grad_norms[s], tolerance * ref.grad_norms[s]) << "step " << s;
  }
  ASSERT_EQ(got.params.size(), ref.params.size());
  for (const auto& [name, p] : ref.params) {
    if (compare && !compare(name)) continue;
    const double scale = std::max(1e-12, p.abs().max().item<double>());
    EXPECT_LE((got.params.at(name) - p).abs().max().item<double>(), tolerance * scale) << name;
  }
}

}  // namespace hyperparallel::testing
