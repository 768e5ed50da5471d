// What fully_shard holds, read off the caching host allocator's byte counts in each rank's own
// process: between steps exactly the parameter shards, their gradients and AdamW's two
// moments; a lone rank never makes a second copy of its parameters or gradients; the gradient
// norm reads a [vocab x hidden]-sized gradient without fp64 copies of it.
//
// The model's tensors are all >= 1 MiB (what the allocator counts) and its activations below:
// the counts are the parameters' buffers and nothing else.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include "hyperparallel/fsdp/clip_grad_norm.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/fsdp/module_hooks.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/platform/host_allocator.h"
#include "support/multiprocess.h"

namespace hyperparallel {
namespace {

using platform::CachingHostAllocator;

constexpr double kMiB = 1024.0 * 1024.0;
constexpr int64_t kIn = 1024, kMid = 1024, kOut = 4096, kRows = 32;

struct Projection : torch::nn::Module {
  Projection(int64_t in, int64_t out) : weight(register_parameter("weight", at::randn({out, in}) * 0.02)) {}
  at::Tensor forward(const at::Tensor& x) {
    return fsdp::hooked_forward(*this, x, [&](const at::Tensor& x) { return at::matmul(x, weight.t()); });
  }
  at::Tensor weight;
};

struct TwoProjections : torch::nn::Module {
  TwoProjections()
      : first(register_module("first", std::make_shared<Projection>(kIn, kMid))),
        second(register_module("second", std::make_shared<Projection>(kMid, kOut))) {}
  at::Tensor forward(const at::Tensor& x) {
    return fsdp::hooked_forward(*this, x, [&](const at::Tensor& x) { return second->forward(first->forward(x)); });
  }
  std::shared_ptr<Projection> first, second;
};

double live_mib() { return static_cast<double>(CachingHostAllocator::stats().live_bytes) / kMiB; }
double peak_above_live_mib() {
  const auto s = CachingHostAllocator::stats();
  return static_cast<double>(s.peak_live_bytes - s.live_bytes) / kMiB;
}

void expect_held_bytes(testing::RankContext& ctx) {
  CachingHostAllocator::install(1ull << 30);
  at::set_num_threads(1);
  const int64_t n = ctx.world_size;
  auto mesh = mesh::init_device_mesh(ctx.world, "cpu", {n}, {"dp_shard"});
  at::manual_seed(7);
  auto model = std::make_shared<TwoProjections>();
  fsdp::FullyShardOptions options;
  options.mesh = mesh;
  fsdp::fully_shard(*model->first, options);
  fsdp::fully_shard(*model, options);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  const double params_mib = static_cast<double>((kIn * kMid + kMid * kOut) * 4) / kMiB / static_cast<double>(n);
  const auto step = [&](int s) {
    at::Tensor x = at::randn({kRows, kIn}, at::detail::createCPUGenerator(static_cast<uint64_t>(100 + s * n + ctx.rank)));
    optimizer.zero_grad();  // set to none
    CachingHostAllocator::reset_peak();
    model->forward(x).pow(2).mean().backward();
    const double backward_peak = peak_above_live_mib();
    CachingHostAllocator::reset_peak();
    const std::vector<double> weights = fsdp::gradient_norm_weights(*model, n);
    const double norm = fsdp::local_squared_gradient_norm(*model, weights).item<double>();
    EXPECT_GT(norm, 0);
    // Slices of 2^20 gradient elements in fp64 and their squares: 16 MiB, not 2 x 2 x the
    // 16 MiB gradient of `second`.
    EXPECT_LE(peak_above_live_mib(), 16.0 + 1e-9) << "step " << s;
    optimizer.step();
    return backward_peak;
  };
  step(0);
  EXPECT_DOUBLE_EQ(live_mib(), 4 * params_mib) << "parameters, gradients, two moments";
  for (int s = 1; s < 3; ++s) {
    const double backward_peak = step(s);
    EXPECT_DOUBLE_EQ(live_mib(), 4 * params_mib) << "step " << s;
    if (n == 1) {
      // Backward's only large allocation is the one gradient autograd makes before adding it
      // into the shard gradients (the largest, `second`'s 16 MiB): no full-parameter or
      // full-gradient buffer, no reduction output.
      EXPECT_LE(backward_peak, static_cast<double>(kMid * kOut * 4) / kMiB) << "step " << s;
    }
  }
}

TEST(FsdpMemory, BetweenStepsOnlyShardsGradientsAndMomentsAndOneRankCopiesNothing) {
  for (int world : {1, 2}) {
    SCOPED_TRACE("world " + std::to_string(world));
    testing::run_on_ranks(world, expect_held_bytes);
  }
}

}  // namespace
}  // namespace hyperparallel
