// Peak memory of loading a ~290 MB Qwen3 checkpoint, whole in one process versus sharded by
// fully_shard over N ranks with deferred initialisation (each rank reads only its rows).
// For docs/benchmarks.md ("Loading"); scripts/bench_models.sh runs it.
//   load_bench prepare DIR          write the checkpoint (3 files of <= 100 MB + index)
//   load_bench full DIR             from_pretrained in one process
//   load_bench sharded DIR          one rank of a job (hyperparallel run --nproc-per-node N)
// Each prints: RESULT mode=... rank=... rss_before_mb=... peak_rss_mb=... growth_mb=...
// where growth = peak RSS (VmHWM, file pages it mapped included) - RSS before loading.
#include <cstdio>
#include <fstream>
#include <string>

#include <ATen/ATen.h>

#include "bench_common.h"
#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/auto_model.h"

namespace hp = hyperparallel;

namespace {

hp::models::ModelConfig bench_config() {
  hp::models::ModelConfig c = hp::models::debug_flavour_config("qwen3-debug");
  c.vocab_size = 16384;
  c.hidden_size = 1024;
  c.num_hidden_layers = 6;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 8;
  c.head_dim = 64;
  c.intermediate_size = 2048;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: load_bench prepare|full|sharded DIR\n");
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  if (mode == "prepare") {
    auto model = hp::models::AutoModelForCausalLM::from_config(bench_config());
    hp::models::SaveOptions save;
    save.max_shard_size = "100MB";
    const auto files = hp::models::save_pretrained(*model, dir, save);
    std::printf("wrote %zu files, %.1f M parameters\n", files.size(), bench_config().parameter_count() / 1e6);
    return 0;
  }
  std::shared_ptr<hp::comm::Communicator> world;
  if (mode == "sharded") world = hp::comm::init_process_group(hp::comm::rendezvous_info_from_env());
  const int rank = world ? world->rank() : 0;
  const double before = hp::benchmarks::status_mb("VmRSS");
  if (mode == "full") {
    auto model = hp::models::AutoModelForCausalLM::from_pretrained(dir);
  } else {
    hp::models::ModelLoadOptions deferred;
    deferred.deferred_init = true;
    auto model = hp::models::AutoModelForCausalLM::from_pretrained(dir, deferred);
    hp::fsdp::FullyShardOptions options;
    options.mesh = hp::mesh::init_device_mesh(world, "cpu", {world->size()}, {"dp_shard"});
    for (auto* layer : model->decoder_layers()) hp::fsdp::fully_shard(*layer, options);
    hp::fsdp::fully_shard(*model, options);
    hp::models::load_pretrained_weights(*model, dir);
    world->barrier().wait();
  }
  const double peak = hp::benchmarks::status_mb("VmHWM");
  std::printf("RESULT mode=%s rank=%d rss_before_mb=%.1f peak_rss_mb=%.1f growth_mb=%.1f\n", mode.c_str(), rank, before, peak,
              peak - before);
  return 0;
}
