// AdamW step time: FusedAdamW vs torch::optim::AdamW on 10 M parameters in tensors of a
// transformer's sizes (512 x 1536 matrices and 512-vectors), fp32, gradients set, weight
// decay on; the two take turns, REPS steps each after a warm-up step. Usage:
// optim_bench [REPS]. Prints: RESULT torch_ms=... fused_ms=... ratio=... threads=...
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_common.h"
#include "hyperparallel/optim/fused_adamw.h"

namespace {

std::vector<at::Tensor> parameters_of_10m() {
  std::vector<at::Tensor> params;
  int64_t total = 0;
  auto gen = at::detail::createCPUGenerator(1);
  while (total < 10'000'000) {
    params.push_back(at::randn({512, 1536}, gen).requires_grad_(true));
    params.push_back(at::randn({512}, gen).requires_grad_(true));
    total += 512 * 1536 + 512;
  }
  for (auto& p : params) p.mutable_grad() = at::randn(p.sizes(), gen);
  return params;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  auto a = parameters_of_10m(), b = parameters_of_10m();
  const auto options = torch::optim::AdamWOptions(1e-4).weight_decay(0.01);
  torch::optim::AdamW torch_adamw(a, options);
  hyperparallel::optim::FusedAdamW fused(b, options);
  std::vector<double> torch_s, fused_s;
  for (int r = 0; r <= reps; ++r) {
    for (bool use_fused : {false, true}) {
      const auto t0 = std::chrono::steady_clock::now();
      use_fused ? fused.step() : torch_adamw.step();
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) (use_fused ? fused_s : torch_s).push_back(dt);
    }
  }
  const double torch_ms = hyperparallel::benchmarks::median_ms(torch_s), fused_ms = hyperparallel::benchmarks::median_ms(fused_s);
  std::printf("RESULT params=10M torch_ms=%.1f fused_ms=%.1f ratio=%.3f threads=%d\n", torch_ms, fused_ms, fused_ms / torch_ms,
              at::get_num_threads());
  return 0;
}
