// Pipeline schedules vs FSDP on 4 ranks: a 16-layer Llama (hidden 256) trained on one global
// batch of PP_BENCH_MICROBATCHES (default 8) micro-batches of 2 rows x 256 tokens per step,
// AdamW, the caching host allocator installed:
//   fsdp4              FSDP over all 4 ranks, each rank 2 of the micro-batches, one after another
//   pp4_gpipe          4 stages of 4 layers (the embedding and head counted as layers), GPipe
//   pp4_1f1b           1F1B
//   pp4_interleaved    interleaved 1F1B, 2 virtual stages per rank (8 stages)
//   pp4_zero_bubble    ZB-H1
// Run under the launcher: hyperparallel run --nproc-per-node 4 -- pp_bench MODE STEPS (another
// rank count makes that many stages; the mode names keep their "pp4_").
// Prints one line: RESULT mode=... step_ms=... bubble=... in_flight=... rss_mb=... rss0_mb=...
// (bubble: 1 - compute time / step time, averaged over the ranks; in_flight: the most
// micro-batch stages rank 0 held for backward; rss: the highest peak RSS over the ranks, and
// rank 0's, which holds the most activations).
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/pp/pipeline.h"
#include "hyperparallel/pp/stage_split.h"

namespace hp = hyperparallel;

namespace {

constexpr int64_t kRows = 2, kTokens = 256;

hp::models::ModelConfig bench_config() {
  hp::models::ModelConfig c = hp::models::debug_flavour_config("llama-debug");
  c.vocab_size = 8192;
  c.hidden_size = 256;
  c.intermediate_size = 768;
  c.num_hidden_layers = 16;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 32;
  return c;
}

hp::models::CausalLMInput micro_batch(int step, int64_t m, int64_t vocab) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 * step + m));
  hp::models::CausalLMInput in;
  in.input_ids = at::randint(vocab, {kRows, kTokens}, gen, at::kLong);
  in.labels = in.input_ids;
  return in;
}

// PP_BENCH_LAYERS="0-8,9-15": each stage's decoder layers (pp_layers), e.g. to balance the
// head's cost; unset: the balanced split, which counts the embedding and the head as one layer.
std::vector<std::string> layer_ranges() {
  std::vector<std::string> out;
  const char* env = std::getenv("PP_BENCH_LAYERS");
  std::string text = env ? env : "";
  for (size_t start = 0; start < text.size();) {
    const size_t comma = std::min(text.find(',', start), text.size());
    out.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

// PP_BENCH_COSTS="F,I,W": the action costs zero_bubble's list is made with ("1,1,1": the
// paper's unit-cost list); unset: the model's estimate (pp::layer_costs), as the trainer does.
hp::pp::ActionCosts costs(const hp::models::ModelConfig& config) {
  hp::pp::ActionCosts c = hp::pp::layer_costs(config, kTokens);
  if (const char* env = std::getenv("PP_BENCH_COSTS")) {
    if (std::sscanf(env, "%lf,%lf,%lf", &c.forward, &c.backward_input, &c.backward_weight) != 3) {
      std::fprintf(stderr, "PP_BENCH_COSTS must be F,I,W (got %s)\n", env);
      std::exit(2);
    }
    c.backward = c.backward_input + c.backward_weight;
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "pp4_1f1b";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 3;
  const int64_t microbatches = std::getenv("PP_BENCH_MICROBATCHES") ? std::atoll(std::getenv("PP_BENCH_MICROBATCHES")) : 8;
  hp::benchmarks::install_host_cache();
  auto world = hp::comm::init_process_group(hp::comm::rendezvous_info_from_env());
  const int64_t n = world->size();
  const auto config = bench_config();
  hp::models::ModelLoadOptions options;
  options.seed = 1;
  auto model = hp::models::AutoModelForCausalLM::from_config(config, options);
  const double scale = 1.0 / static_cast<double>(microbatches * kRows * (kTokens - 1));
  const hp::pp::ActionCosts action_costs = costs(config);
  std::unique_ptr<hp::pp::PipelineStage> stage;
  std::optional<hp::fsdp::FSDPModule> root;
  if (mode == "fsdp4") {
    const auto mesh = hp::mesh::init_device_mesh(world, "cpu", {n}, {"dp_shard"});
    hp::fsdp::FullyShardOptions shard;
    shard.mesh = mesh;
    for (auto* layer : model->decoder_layers()) hp::fsdp::fully_shard(*layer, shard);
    root = hp::fsdp::fully_shard(*model, shard);
    root->set_reduce_op_type("sum");
  } else {
    const std::string schedule = mode.substr(4) == "interleaved" ? "interleaved_1f1b" : mode.substr(4);
    const int64_t virtual_stages = schedule == "interleaved_1f1b" ? 2 : 1;
    const std::vector<std::string> ranges = layer_ranges();
    const auto split = ranges.empty() ? hp::pp::balanced_split(config.num_hidden_layers, n * virtual_stages)
                                      : hp::pp::explicit_split(ranges, config.num_hidden_layers, n * virtual_stages);
    hp::pp::keep_stages(*model, split, world->rank(), n);
    stage = std::make_unique<hp::pp::PipelineStage>(*model, split, hp::pp::make_schedule(schedule, n, microbatches, virtual_stages, action_costs),
                                                    world);
  }
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4));
  hp::benchmarks::StepMeter meter({world});
  double busy = 0, total = 0;
  int64_t in_flight = 0;
  meter.run(*world, steps, [&](int s) {
    opt.zero_grad();
    if (stage) {
      std::vector<hp::models::CausalLMInput> inputs;
      for (int64_t m = 0; m < microbatches; ++m) inputs.push_back(micro_batch(s, m, config.vocab_size));
      const hp::pp::PipelineStepResult r = stage->run(inputs, scale);
      busy += r.busy_seconds;
      total += r.step_seconds;
      in_flight = std::max(in_flight, r.peak_in_flight);
    } else {
      const int64_t mine = microbatches / n;
      for (int64_t k = 0; k < mine; ++k) {
        root->set_requires_gradient_sync(k + 1 == mine);
        (model->forward(micro_batch(s, world->rank() * mine + k, config.vocab_size)).lm_loss_sum * scale).backward();
      }
    }
    opt.step();
  });
  at::Tensor stats = at::tensor({hp::benchmarks::peak_rss_mb(), total > 0 ? 1.0 - busy / total : 0.0}, at::kDouble);
  const double rss0 = stats[0].item<double>();
  at::Tensor rss = stats.narrow(0, 0, 1).clone(), bubble = stats.narrow(0, 1, 1).clone();
  world->all_reduce(rss, hp::comm::ReduceOp::kMax).wait();
  world->all_reduce(bubble, hp::comm::ReduceOp::kSum).wait();
  if (world->rank() == 0 && stage) {
    const hp::pp::ScheduleTiming sim = hp::pp::simulate(stage->schedule(), action_costs);
    std::printf("SIMULATED makespan=%.0f bubble=%.3f\n", sim.makespan, sim.bubble);
  }
  if (world->rank() == 0) {
    std::printf("RESULT mode=%s ranks=%lld microbatches=%lld step_ms=%.0f bubble=%.3f in_flight=%lld rss_mb=%.0f rss0_mb=%.0f\n",
                mode.c_str(), static_cast<long long>(n), static_cast<long long>(microbatches), meter.median_step_ms(),
                bubble.item<double>() / static_cast<double>(n), static_cast<long long>(in_flight), rss.item<double>(), rss0);
  }
  world->barrier().wait();
  return 0;
}
