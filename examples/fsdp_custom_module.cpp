// A complete program: shard your own LibTorch module with fully_shard and train it on
// several processes. Run with the launcher:
//
//   build/hyperparallel run --nproc-per-node 2 -- build/fsdp_custom_module
//
// The one step a module takes to become shardable is in forward(): wrap the body in
// hyperparallel::fsdp::hooked_forward(*this, [&] { ... }).
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <cstdio>

#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/fsdp/module_hooks.h"
#include "hyperparallel/mesh/device_mesh.h"

namespace hp = hyperparallel;

struct MlpBlock : torch::nn::Module {
  MlpBlock(int64_t dim, int64_t hidden)
      : up(register_module("up", torch::nn::Linear(dim, hidden))),
        down(register_module("down", torch::nn::Linear(hidden, dim))) {}
  at::Tensor forward(const at::Tensor& x) {
    return hp::fsdp::hooked_forward(*this, [&] { return x + down(at::gelu(up(x))); });  // the one step
  }
  torch::nn::Linear up, down;
};

struct Net : torch::nn::Module {
  explicit Net(int64_t dim) : head(register_module("head", torch::nn::Linear(dim, 1))) {
    for (int i = 0; i < 4; ++i) blocks.push_back(register_module("block" + std::to_string(i), std::make_shared<MlpBlock>(dim, 4 * dim)));
  }
  at::Tensor forward(at::Tensor x) {
    return hp::fsdp::hooked_forward(*this, [&] {
      for (auto& b : blocks) x = b->forward(x);
      return head(x);
    });
  }
  std::vector<std::shared_ptr<MlpBlock>> blocks;
  torch::nn::Linear head;
};

int main() {
  // Rank, world size and the master come from the launcher's environment.
  auto world = hp::comm::init_process_group(hp::comm::rendezvous_info_from_env());
  auto mesh = hp::mesh::init_device_mesh(world, "cpu", {world->size()}, {"dp_shard"});

  at::manual_seed(0);  // every rank starts from the same weights
  auto net = std::make_shared<Net>(64);
  hp::fsdp::FullyShardOptions options;
  options.mesh = mesh;
  for (auto& b : net->blocks) hp::fsdp::fully_shard(*b, options);  // bottom-up: blocks first
  hp::fsdp::fully_shard(*net, options);                            // then the root

  // Built after fully_shard: the optimizer sees (and keeps state for) local shards only.
  torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(1e-3));
  at::manual_seed(100 + world->rank());  // each rank its own data
  for (int step = 0; step < 10; ++step) {
    at::Tensor x = at::randn({32, 64});
    at::Tensor loss = (net->forward(x) - x.sum(1, true)).pow(2).mean();
    opt.zero_grad();
    loss.backward();  // gradients are averaged over the ranks and reduce-scattered
    opt.step();
    if (world->rank() == 0) std::printf("step %d loss %.4f\n", step, loss.item<double>());
  }
  return 0;
}
