// The flagship layout through the trainer: a debug Qwen3-MoE (8 heads, 4 kv heads, 8 experts)
// on 8 ranks as TP2 (sequence and loss parallel) x CP2 x EP2 x FSDP2, 10 steps, against the
// plain one-process model at the same global batch — total and aux loss and gradient norm of
// every step within 1e-5 — for each CP algorithm that fits cp 2 (ring, Ulysses, all-gather),
// with model.validate_placement off and on (the two bit-identical).
#include <gtest/gtest.h>

#include <filesystem>

#include "hyperparallel/models/model_config.h"
#include "support/hf_folder.h"
#include "support/multiprocess.h"
#include "support/trainer_runs.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;
using namespace hp::testing::trainer_runs;

namespace {

hp::models::ModelConfig flagship_debug_config() {
  hp::models::ModelConfig c = hp::models::debug_flavour_config("qwen3-moe-debug");
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 16;
  return c;
}

}  // namespace

TEST(Flagship, Tp2Cp2Ep2Fsdp2OnEightRanksMatchesThePlainModel) {
  const std::string folder = temp_dir("flagship_model");
  if (!hp::testing::is_rank_process()) hp::testing::write_hf_folder(folder, flagship_debug_config(), 3);
  const std::vector<std::string> layout = {"per_device_train_batch_size=4",      "accelerator.tp_size=2",
                                           "accelerator.cp_size=2",              "accelerator.ep_size=2",
                                           "accelerator.sequence_parallel=true", "accelerator.loss_parallel=true",
                                           "fsdp_config.dp_shard_size=2"};
  const auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), layout.begin(), layout.end());
    return extra;
  };
  expect_runs_match_the_plain_model(
      {"model_name_or_path=" + folder, "max_steps=10", "learning_rate=3.0e-3"},
      {{"flagship_ring", 8, with({"accelerator.cp_algorithm=ring"})},
       {"flagship_ring_validated", 8, with({"accelerator.cp_algorithm=ring", "model.validate_placement=true"})},
       {"flagship_ulysses", 8, with({"accelerator.cp_algorithm=ulysses"})},
       {"flagship_allgather", 8, with({"accelerator.cp_algorithm=allgather"})}},
      10, /*keep_outputs=*/true);
  // Validation mode measures every boundary's placement and changes nothing.
  EXPECT_EQ(logged_losses(temp_dir("flagship_ring_validated")), logged_losses(temp_dir("flagship_ring")));
  EXPECT_EQ(logged(temp_dir("flagship_ring_validated"), "aux_loss"), logged(temp_dir("flagship_ring"), "aux_loss"));
  for (const char* name : {"flagship_ring", "flagship_ring_validated", "flagship_ulysses", "flagship_allgather", "flagship_model"}) {
    fs::remove_all(temp_dir(name));
  }
}
