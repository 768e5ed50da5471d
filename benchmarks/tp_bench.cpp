// Tensor parallelism vs FSDP on 4 ranks, a ~48 M Qwen3 (the model_bench shape), one global
// batch of 8 x 256 tokens per step, AdamW, the caching host allocator installed:
//   fsdp4       FSDP over 4 ranks (each rank 2 rows)
//   tp4         TP4 + sequence + loss parallel (every rank all 8 rows)
//   fsdp2_tp2   FSDP2 x TP2 + sequence + loss parallel (each tp group 4 rows)
//   tp4_validate  tp4 in Validation mode (tp/placement_checks.h): the cost of the checks
// Run under the launcher: hyperparallel run --nproc-per-node 4 -- tp_bench MODE STEPS.
// Prints one line: RESULT mode=... step_ms=... exposed=... bytes_mb=... exact_mb=... local_params=... rss_mb=...
// `exposed` is the share of the step spent blocked in wait() on any of the job's groups;
// `exact_mb` the traffic our design moves per rank and step (docs/benchmarks.md "Tensor parallelism").
#include <torch/optim/adamw.h>

#include <cstdio>
#include <string>

#include "bench_common.h"
#include "bench_qwen3.h"
#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/tp/loss_parallel.h"
#include "hyperparallel/tp/model_plans.h"

namespace hp = hyperparallel;

namespace {

constexpr int64_t kRows = 8, kSeq = 256;

// Our design's bytes per rank and step. FSDP over n: blocks all-gather twice and
// reduce-scatter once, the root gathers once. TP over t with SP + LP, per layer: two
// all-gathers and two reduce-scatters of [tokens/t, hidden] each way; the embedding's
// reduce-scatter and its dual, the final norm's gather and its dual; the norms' weight
// gradients and the loss's three per-token floats are all-reduced.
double exact_bytes(const hp::models::ModelConfig& c, int64_t dp, int64_t tp, const std::vector<int64_t>& unit_numels,
                   int64_t rows_per_group) {
  double bytes = 0;
  for (size_t u = 0; u < unit_numels.size(); ++u) {
    const bool root = u + 1 == unit_numels.size();
    bytes += (root ? 2.0 : 3.0) * (dp - 1) * unit_numels[u] * 4;
  }
  if (tp > 1) {
    const int64_t tokens = rows_per_group * kSeq;
    const double shard = static_cast<double>((kSeq + tp - 1) / tp) * rows_per_group * c.hidden_size * 4;
    const int64_t L = c.num_hidden_layers;
    bytes += (8.0 * L + 4.0) * (tp - 1) * shard;  // 4L+2 gathers and 4L+2 scatters
    auto all_reduce = [&](int64_t numel) { return 2.0 * (tp - 1) * ((numel + tp - 1) / tp) * 4; };
    bytes += (2 * L + 1) * all_reduce(c.hidden_size) + 2 * L * all_reduce(c.head_dim) + 3 * all_reduce(tokens);
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "fsdp4";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 4;
  hp::benchmarks::install_host_cache();
  auto world = hp::comm::init_process_group(hp::comm::rendezvous_info_from_env());
  const int64_t n = world->size();
  const bool validate = mode == "tp4_validate";  // Validation mode: the same plan, every boundary checked
  const int64_t tp = mode == "tp4" || validate ? n : mode == "fsdp2_tp2" ? 2 : 1, dp = n / tp;
  const auto config = hp::benchmarks::qwen3_48m_config();
  hp::models::ModelLoadOptions options;
  options.seed = 1;
  auto model = hp::models::AutoModelForCausalLM::from_config(config, options);

  auto mesh = hp::mesh::init_device_mesh(world, "cpu", {dp, tp}, {"dp_shard", "tp"});
  if (tp > 1) {
    hp::tp::TensorParallelOptions tp_options;
    tp_options.sequence_parallel = tp_options.loss_parallel = true;
    hp::tp::ParallelizeOptions run_mode;
    run_mode.validate_placement = validate;
    hp::tp::parallelize_module(*model, mesh["tp"], hp::tp::plan_for(config, tp, tp_options), run_mode);
    hp::tp::enable_loss_parallel(*model, mesh["tp"]);
  }
  std::vector<int64_t> unit_numels;
  if (dp > 1) {
    hp::fsdp::FullyShardOptions shard;
    shard.mesh = mesh["dp_shard"];
    for (auto* layer : model->decoder_layers()) unit_numels.push_back(hp::fsdp::fully_shard(*layer, shard).sharded_numel());
    unit_numels.push_back(hp::fsdp::fully_shard(*model, shard).sharded_numel());
  }
  int64_t local_params = 0;
  for (const auto& p : model->parameters()) local_params += p.numel();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4));
  hp::benchmarks::StepMeter meter({mesh.comm("dp_shard"), mesh.comm("tp")});

  const int64_t rows = kRows / dp, dp_rank = mesh.coordinates()[0];
  meter.run(*world, steps, [&](int s) {
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(100 + s));
    const at::Tensor ids = at::randint(config.vocab_size, {kRows, kSeq}, gen, at::kLong);
    hp::models::CausalLMInput in;
    in.input_ids = ids.narrow(0, dp_rank * rows, rows);
    in.labels = in.input_ids;
    auto out = model->forward(in);
    opt.zero_grad();
    out.loss.backward();
    opt.step();
  });
  at::Tensor rss = at::tensor({hp::benchmarks::peak_rss_mb()}, at::kDouble);
  world->all_reduce(rss, hp::comm::ReduceOp::kMax).wait();
  if (world->rank() == 0) {
    std::printf("RESULT mode=%s ranks=%lld params=%.1fM local_params=%.1fM step_ms=%.0f exposed=%.3f bytes_mb=%.1f "
                "exact_mb=%.1f rss_mb=%.0f\n",
                mode.c_str(), static_cast<long long>(n), config.parameter_count() / 1e6, local_params / 1e6,
                meter.median_step_ms(), meter.exposed_share(), meter.mb_per_step(),
                exact_bytes(config, dp, tp, unit_numels, rows) / 1e6, rss.item<double>());
  }
  world->barrier().wait();
  return 0;
}
