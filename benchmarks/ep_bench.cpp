// Expert parallelism vs FSDP on 4 ranks, a Qwen3-MoE with 16 experts (top-2), one global batch
// of 8 x 256 tokens per step, AdamW, the caching host allocator installed:
//   fsdp4          every expert on every rank, FSDP over 4 (each rank 2 rows), the loop over experts
//   fsdp4_grouped  the same with the grouped_experts override (sort once, contiguous rows)
//   ep4            4 experts per rank, all-to-all dispatch; dense layers FSDP over 4
//   ep2_edp2       8 experts per rank, each expert FSDP-sharded over 2 ranks
// Run under the launcher: hyperparallel run --nproc-per-node 4 -- ep_bench MODE STEPS.
// `ep_bench grouped_vs_loop REPS` (one process) times one MoE block's forward + backward on
// 2048 tokens with the loop and with grouped experts, interleaved, and prints both medians.
// Prints one line: RESULT mode=... step_ms=... exposed=... bytes_mb=... a2a_mb=... local_params=... rss_mb=...
// `exposed` is the share of the step spent blocked in wait() on any of the job's groups,
// `a2a_mb` the all-to-all bytes this rank sent per step (docs/benchmarks.md "Expert parallelism").
#include <torch/optim/adamw.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench_common.h"
#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/ep/expert_parallel.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/models/plan_overrides.h"
#include "models/grouped_experts.h"

namespace hp = hyperparallel;

namespace {

constexpr int64_t kRows = 8, kSeq = 256;

// ~27 M parameters, 80 % of them in the experts.
hp::models::ModelConfig moe_config() {
  hp::models::ModelConfig c = hp::models::debug_flavour_config("qwen3-moe-debug");
  c.vocab_size = 8192;
  c.hidden_size = 256;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 32;
  c.num_experts = 16;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 448;
  return c;
}

// One block of the model, forward + backward, the loop and grouped experts taking turns.
int grouped_vs_loop(int reps) {
  const auto config = moe_config();
  hp::models::ModelLoadOptions options;
  options.seed = 1;
  auto model = hp::models::AutoModelForCausalLM::from_config(config, options);
  hp::models::SparseMoeBlock* block = nullptr;
  for (const auto& item : model->named_modules()) {
    if (!block) block = dynamic_cast<hp::models::SparseMoeBlock*>(item.value().get());
  }
  auto gen = at::detail::createCPUGenerator(3);
  const int64_t rows = std::getenv("EP_BENCH_ROWS") ? std::atoll(std::getenv("EP_BENCH_ROWS")) : kRows;
  const at::Tensor x = at::randn({rows, kSeq, config.hidden_size}, gen, at::kFloat).requires_grad_(true);
  const at::Tensor grad = at::randn({rows, kSeq, config.hidden_size}, gen, at::kFloat);
  const auto grouped = std::make_shared<hp::models::GroupedExpertDispatch>();
  std::vector<double> loop_s, grouped_s;
  for (int r = 0; r < reps + 1; ++r) {
    for (bool use_grouped : {false, true}) {
      block->dispatch = use_grouped ? grouped : nullptr;
      const auto t0 = std::chrono::steady_clock::now();
      (block->forward(x, nullptr) * grad).sum().backward();
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) (use_grouped ? grouped_s : loop_s).push_back(dt);
    }
  }
  const double loop_ms = hp::benchmarks::median_ms(loop_s), grouped_ms = hp::benchmarks::median_ms(grouped_s);
  std::printf("RESULT mode=grouped_vs_loop tokens=%lld experts=%lld loop_ms=%.1f grouped_ms=%.1f ratio=%.3f\n",
              static_cast<long long>(rows * kSeq), static_cast<long long>(config.num_experts), loop_ms, grouped_ms,
              grouped_ms / loop_ms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "fsdp4";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 4;
  hp::benchmarks::install_host_cache();
  if (mode == "grouped_vs_loop") return grouped_vs_loop(steps);
  auto world = hp::comm::init_process_group(hp::comm::rendezvous_info_from_env());
  const int64_t n = world->size();
  const int64_t ep = mode == "ep4" ? n : mode == "ep2_edp2" ? 2 : 1;
  const auto config = moe_config();
  hp::models::ModelLoadOptions options;
  options.seed = 1;
  if (mode == "fsdp4_grouped") options.plan_overrides = {{"*.mlp", "Qwen3MoeSparseMoeBlock", "grouped_experts"}};
  auto model = hp::models::AutoModelForCausalLM::from_config(config, options);

  const auto dense = hp::mesh::init_device_mesh(world, "cpu", {n}, {"dp_shard"});
  std::vector<std::shared_ptr<hp::comm::Communicator>> groups{dense.comm()};
  hp::fsdp::FullyShardOptions shard;
  shard.mesh = dense;
  if (ep > 1) {
    const auto experts = hp::mesh::init_device_mesh(world, "cpu", {n / ep, ep}, {"edp", "ep"});
    hp::ep::parallelize_experts(*model, experts["ep"]);
    hp::fsdp::FullyShardOptions expert_shard = shard;
    expert_shard.mesh = experts["edp"];
    for (auto* m : hp::ep::expert_modules(*model)) hp::fsdp::fully_shard(*m, expert_shard);
    groups.push_back(experts.comm("ep"));
    groups.push_back(experts.comm("edp"));
  }
  for (auto* layer : model->decoder_layers()) hp::fsdp::fully_shard(*layer, shard);
  hp::fsdp::fully_shard(*model, shard);
  int64_t local_params = 0;
  for (const auto& p : model->parameters()) local_params += p.numel();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4));

  const int64_t rows = kRows / n;
  hp::benchmarks::StepMeter meter(groups);
  meter.run(*world, steps, [&](int s) {
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(100 + s));
    const at::Tensor ids = at::randint(config.vocab_size, {kRows, kSeq}, gen, at::kLong);
    hp::models::CausalLMInput in;
    in.input_ids = ids.narrow(0, world->rank() * rows, rows);
    in.labels = in.input_ids;
    in.output_router_logits = false;
    auto out = model->forward(in);
    opt.zero_grad();
    out.loss.backward();
    opt.step();
  });
  at::Tensor rss = at::tensor({hp::benchmarks::peak_rss_mb()}, at::kDouble);
  world->all_reduce(rss, hp::comm::ReduceOp::kMax).wait();
  if (world->rank() == 0) {
    std::printf("RESULT mode=%s ranks=%lld params=%.1fM local_params=%.1fM step_ms=%.0f exposed=%.3f bytes_mb=%.1f "
                "a2a_mb=%.1f rss_mb=%.0f\n",
                mode.c_str(), static_cast<long long>(n), config.parameter_count() / 1e6, local_params / 1e6,
                meter.median_step_ms(), meter.exposed_share(), meter.mb_per_step(), meter.all_to_all_mb_per_step(),
                rss.item<double>());
  }
  world->barrier().wait();
  return 0;
}
