// Context parallelism vs FSDP on 4 ranks: a 2-layer Qwen3 (8 heads, 4 kv heads) on one
// global batch of 4 rows x CP_BENCH_TOKENS (default 4096) tokens per step, AdamW, the caching
// host allocator installed, FSDP over all 4 ranks in every mode:
//   fsdp4          each rank one whole row (eager attention over [T x T])
//   cp4_ulysses    every rank a zigzag quarter of every row, Ulysses over 4
//   cp4_allgather  K/V all-gathered
//   cp4_ring       K/V blocks around the ring, online softmax
//   cp4_hybrid     Ulysses pairs inside a ring of 2
// Run under the launcher: hyperparallel run --nproc-per-node 4 -- cp_bench MODE STEPS [TRACE.json].
// Prints one line: RESULT mode=... step_ms=... exposed=... bytes_mb=... rss_mb=...
// (`exposed`: the share of the step blocked in wait() on any group; rss: the highest peak RSS
// over the ranks). With TRACE.json the last step's communication spans of every rank are
// written as one Chrome trace (docs/benchmarks.md "Context parallelism").
#include <torch/optim/adamw.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "bench_common.h"
#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/cp/context_parallel.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/platform/trace.h"

namespace hp = hyperparallel;

namespace {

constexpr int64_t kRows = 4;

hp::models::ModelConfig bench_config() {
  hp::models::ModelConfig c = hp::models::debug_flavour_config("qwen3-debug");
  c.vocab_size = 8192;
  c.hidden_size = 256;
  c.intermediate_size = 768;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 32;
  c.max_position_embeddings = 32768;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "cp4_ring";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 3;
  const std::string trace_path = argc > 3 ? argv[3] : "";
  const int64_t tokens = std::getenv("CP_BENCH_TOKENS") ? std::atoll(std::getenv("CP_BENCH_TOKENS")) : 4096;
  hp::benchmarks::install_host_cache();
  auto world = hp::comm::init_process_group(hp::comm::rendezvous_info_from_env());
  const int64_t n = world->size();
  const auto config = bench_config();
  hp::models::ModelLoadOptions options;
  options.seed = 1;
  auto model = hp::models::AutoModelForCausalLM::from_config(config, options);
  const bool context_parallel = mode != "fsdp4";
  if (context_parallel) {
    hp::cp::ContextParallelOptions cp;
    cp.algorithm = mode.substr(4);
    if (cp.algorithm == "hybrid") cp.ulysses_degree = 2;
    hp::cp::parallelize_context(*model, world, cp);
  }
  const auto mesh = hp::mesh::init_device_mesh(world, "cpu", {n}, {"dp_shard_cp"});
  hp::fsdp::FullyShardOptions shard;
  shard.mesh = mesh;
  for (auto* layer : model->decoder_layers()) hp::fsdp::fully_shard(*layer, shard);
  hp::fsdp::FSDPModule root = hp::fsdp::fully_shard(*model, shard);
  root.set_reduce_op_type("sum");
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4));
  auto trace = std::make_shared<hp::platform::TraceRecorder>();

  // Every group the step talks on; the hybrid's groups are the core's own (groups of the
  // same ranks are one Communicator).
  std::vector<std::shared_ptr<hp::comm::Communicator>> groups{world, mesh.comm()};
  if (mode == "cp4_hybrid") {
    const int r = world->rank();
    groups.push_back(world->group({r / 2 * 2, r / 2 * 2 + 1}, "cp_ulysses"));
    groups.push_back(world->group({r % 2, r % 2 + 2}, "cp_ring"));
  }
  hp::benchmarks::StepMeter meter(groups);
  meter.run(*world, steps, [&](int s) {
    if (!trace_path.empty() && s == steps) {
      world->set_trace(trace);
      root.set_trace(trace);
    }
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(100 + s));
    const at::Tensor ids = at::randint(config.vocab_size, {kRows, tokens}, gen, at::kLong);
    hp::models::CausalLMInput in;
    if (context_parallel) {
      in.input_ids = ids;
      in.labels = ids;
      in = hp::cp::shard_sequence(in, n, world->rank());
    } else {
      in.input_ids = ids.narrow(0, world->rank() * kRows / n, kRows / n);
      in.labels = in.input_ids;
    }
    auto out = model->forward(in);
    opt.zero_grad();
    out.lm_loss_sum.div(static_cast<double>(kRows * (tokens - 1))).backward();
    opt.step();
  });
  at::Tensor rss = at::tensor({hp::benchmarks::peak_rss_mb()}, at::kDouble);
  world->all_reduce(rss, hp::comm::ReduceOp::kMax).wait();
  if (!trace_path.empty()) hp::benchmarks::write_trace(*world, *trace, trace_path);
  if (world->rank() == 0) {
    std::printf("RESULT mode=%s ranks=%lld tokens=%lld step_ms=%.0f exposed=%.3f bytes_mb=%.1f rss_mb=%.0f\n", mode.c_str(),
                static_cast<long long>(n), static_cast<long long>(tokens), meter.median_step_ms(), meter.exposed_share(),
                meter.mb_per_step(), rss.item<double>());
  }
  world->barrier().wait();
  return 0;
}
