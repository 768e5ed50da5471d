// hyperparallel train with pipeline parallelism against the plain unsharded model at the same
// global batch: every schedule at pp 2, 1F1B at pp 4, pp2 x FSDP2, HSDP, TP2 + SP and CP2, and
// with activation checkpointing (tied embeddings on the first and last stage); Qwen3-MoE with
// its aux loss pooled across stages (and with EP); the configs that do not fit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hyperparallel/train/trainer.h"
#include "support/multiprocess.h"
#include "support/trainer_runs.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;
using namespace hp::testing::trainer_runs;

TEST(TrainerPipeline, PipelineLayoutsMatchThePlainModel) {
  const std::string pp2 = "accelerator.pp_size=2", micro4 = "accelerator.pp_microbatches=4";
  expect_runs_match_the_plain_model(
      {}, {{"pp2_1f1b", 2, {"per_device_train_batch_size=2", pp2, micro4}},
           {"pp2_gpipe", 2, {"per_device_train_batch_size=2", pp2, micro4, "accelerator.pp_schedule=gpipe"}},
           {"pp2_zero_bubble", 2, {"per_device_train_batch_size=2", pp2, micro4, "accelerator.pp_schedule=zero_bubble"}},
           {"pp2_interleaved", 2,
            {"per_device_train_batch_size=2", pp2, micro4, "accelerator.pp_schedule=interleaved_1f1b", "accelerator.pp_virtual_stages=2"}},
           {"pp4_1f1b", 4, {"per_device_train_batch_size=2", "accelerator.pp_size=4", micro4}},
           {"pp2_fsdp2", 4, {"per_device_train_batch_size=2", pp2, "gradient_accumulation_steps=2"}},
           {"pp2_tp2_sp", 4,
            {"per_device_train_batch_size=4", pp2, "accelerator.pp_microbatches=2", "accelerator.tp_size=2", "accelerator.sequence_parallel=true"}},
           {"pp2_hsdp", 4, {"per_device_train_batch_size=2", pp2, "gradient_accumulation_steps=2", "fsdp_config.dp_shard_size=1"}},
           {"pp2_cp2", 4, {"per_device_train_batch_size=4", pp2, "accelerator.pp_microbatches=2", "accelerator.cp_size=2"}},
           {"pp2_checkpointed", 2, {"per_device_train_batch_size=2", pp2, micro4, "activation_checkpoint.mode=full"}}},
      20);
}

// One micro-batch per step: the plain model's aux loss is one forward's over the global batch.
TEST(TrainerPipeline, PipelineMoeLayoutsMatchThePlainModel) {
  expect_runs_match_the_plain_model({"model_name_or_path=qwen3-moe-debug", "learning_rate=3.0e-3"},
                                    {{"moe_pp2", 2, {"per_device_train_batch_size=8", "accelerator.pp_size=2"}},
                                     {"moe_pp2_zero_bubble", 2,
                                      {"per_device_train_batch_size=8", "accelerator.pp_size=2", "accelerator.pp_schedule=zero_bubble"}},
                                     {"moe_pp2_ep2", 4, {"per_device_train_batch_size=4", "accelerator.pp_size=2", "accelerator.ep_size=2"}},
                                     // The experts' FSDP unit (over 2 edp ranks) sits inside the layer:
                                     // W must call its hook, or their gradients are never reduced.
                                     {"moe_pp2_ep2_edp2_zero_bubble", 8,
                                      {"per_device_train_batch_size=2", "accelerator.pp_size=2", "accelerator.ep_size=2",
                                       "accelerator.pp_schedule=zero_bubble"}}},
                                    20);
}

TEST(TrainerPipeline, PipelineConfigsThatDoNotFitAreUserErrors) {
  const std::vector<std::tuple<int, std::vector<std::string>, std::string>> misfits = {
      {3, {"accelerator.pp_size=2"}, "accelerator.tp_size 1 x pp_size 2 = 2 does not divide the world size 3"},
      {2, {"accelerator.pp_size=2", "accelerator.pp_layers=[0-1, 3-3]"}, "range '3-3' should start at layer 2"},
      {2, {"accelerator.pp_size=2", "accelerator.pp_schedule=interleaved_1f1b", "accelerator.pp_virtual_stages=2",
           "accelerator.pp_microbatches=3"},
       "multiple"},
      {2, {"accelerator.pp_size=2", "accelerator.pp_schedule=zero_bubble", "activation_checkpoint.mode=full"},
       "activation checkpointing recomputes or chunks inside its backward"},
      {2, {"accelerator.pp_size=2", "accelerator.pp_virtual_stages=4", "accelerator.pp_schedule=interleaved_1f1b",
           "accelerator.pp_microbatches=2"},
       "use at most 6 stages"}};
  expect_user_errors_before_training(misfits, "pp_misfit");
}
