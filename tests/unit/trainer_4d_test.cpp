// The flagship layout through the trainer: a debug Qwen3-MoE (8 heads, 4 kv heads, 8 experts)
// on 8 ranks as TP2 (sequence and loss parallel) x CP2 x EP2 x FSDP2, 10 steps, against the
// plain one-process model at the same global batch — total and aux loss and gradient norm of
// every step within 1e-5 — for each CP algorithm that fits cp 2 (ring, Ulysses, all-gather),
// with model.validate_placement off and on (the two bit-identical); and the same job from
// HyperParallel's own YAML (examples/hp_qwen3_moe_4d.yaml).
#include <gtest/gtest.h>

#include <filesystem>

#include <sstream>

#include "hyperparallel/models/model_config.h"
#include "hyperparallel/train/trainer.h"
#include "support/hf_folder.h"
#include "support/multiprocess.h"
#include "support/plain_reference.h"
#include "support/trainer_runs.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;
using namespace hp::testing::trainer_runs;

namespace {

hp::models::ModelConfig flagship_debug_config() { return hp::models::debug_flavour_config("qwen3-moe-4d-debug"); }

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

// examples/hp_qwen3_moe_4d.yaml as written (HyperParallel's dialect, Ulysses from its `when: cp`
// wrapper) on 8 ranks, 10 steps, against the plain model on the same file's job in one process.
TEST(Flagship, HyperParallelsOwnYamlTrainsAsOneProcess) {
  const std::string out = temp_dir("flagship_hp_yaml"), plain_out = temp_dir("flagship_hp_yaml_plain");
  const std::string example = HP_SOURCE_DIR "/examples/hp_qwen3_moe_4d.yaml";
  const std::vector<std::string> common = {"training.train_iters=10", "logging_steps=1",
                                           "dataset.model_assets.tokenizer.pretrained_model_name_or_path=" HP_SOURCE_DIR "/examples/tokenizer",
                                           "model.validate_placement=true"};
  std::vector<std::string> layout = common;
  layout.push_back("checkpoint.checkpoint_dir=" + out);
  const hp::train::TrainConfig config = hp::train::load_train_config(example, layout);
  ASSERT_EQ(config.accelerator.cp_algorithm, "ulysses");
  if (!hp::testing::is_rank_process()) fs::remove_all(out);
  hp::testing::run_on_ranks(8, [&](hp::testing::RankContext& ctx) {
    std::ostringstream log;
    hp::train::run_training(config, ctx.world, log);
  });
  std::vector<std::string> one = common;
  for (const char* o : {"training.micro_batch_size=8", "accelerator.tp_size=1", "accelerator.cp_size=1", "accelerator.ep_size=1",
                        "accelerator.sequence_parallel=false", "accelerator.loss_parallel=false", "fsdp_config.dp_shard_size=-1",
                        "fsdp_config.edp_shard_size=-1", "model.validate_placement=false"}) {
    one.push_back(o);
  }
  one.push_back("checkpoint.checkpoint_dir=" + plain_out);
  const hp::testing::PlainRun ref = hp::testing::plain_reference_run(hp::train::load_train_config(example, one));
  const auto losses = logged_losses(out), aux = logged(out, "aux_loss");
  ASSERT_EQ(losses.size(), 10u);
  ASSERT_EQ(ref.losses.size(), 10u);
  for (size_t s = 0; s < losses.size(); ++s) {
    EXPECT_NEAR(losses[s], ref.losses[s], 1e-5 * ref.losses[s]) << "step " << s + 1;
    EXPECT_NEAR(aux[s], ref.aux_losses[s], 1e-5 * ref.aux_losses[s]) << "aux, step " << s + 1;
  }
  fs::remove_all(out);
  fs::remove_all(plain_out);
}
