// hyperparallel train on every parallel layout against the plain unsharded model at the same
// global batch: MoE (global aux loss), expert, tensor and context parallelism, activation
// checkpointing and swap, the chunked loss, Muon, optimizer offload, the eval loss, and the
// layouts that do not fit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/train/trainer.h"
#include "support/multiprocess.h"
#include "support/plain_reference.h"
#include "support/trainer_runs.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;
using namespace hp::testing::trainer_runs;

// Qwen3-MoE through the trainer, moe_aux_loss_scope global: the total loss (lm + coef x aux)
// and the aux loss of every step against the plain model's one forward per global batch, for
// data-parallel splits and tensor parallelism; micro_batch scope on one process is HF's own
// per-forward number, and on 2 ranks it is not the plain model's (why global exists).
TEST(TrainerExperts, MoeLayoutsMatchThePlainModelWithTheGlobalAuxLoss) {
  const std::vector<std::string> moe = {"model_name_or_path=qwen3-moe-debug", "max_steps=10", "learning_rate=3.0e-3"};
  const std::vector<std::tuple<std::string, int, std::vector<std::string>>> layouts = {
      {"moe_one_process", 1, {"per_device_train_batch_size=8"}},
      {"moe_fsdp2", 2, {"per_device_train_batch_size=4"}},
      {"moe_fsdp4", 4, {"per_device_train_batch_size=2"}},
      {"moe_tp2", 2, {"per_device_train_batch_size=8", "accelerator.tp_size=2"}},
      {"moe_fsdp2_micro", 2, {"per_device_train_batch_size=4", "moe_aux_loss_scope=micro_batch"}},
      {"moe_one_process_micro", 1, {"per_device_train_batch_size=8", "moe_aux_loss_scope=micro_batch"}}};
  for (const auto& [name, ranks, layout] : layouts) {
    std::vector<std::string> extra = moe;
    extra.insert(extra.end(), layout.begin(), layout.end());
    train_on(ranks, temp_dir(name), extra, 10);
  }
  std::vector<std::string> overrides = base_overrides(temp_dir("moe_plain"));
  overrides.insert(overrides.end(), moe.begin(), moe.end());
  overrides.push_back("per_device_train_batch_size=8");
  const hp::testing::PlainRun ref = hp::testing::plain_reference_run(hp::train::load_train_config("", overrides));
  ASSERT_EQ(ref.aux_losses.size(), 10u);
  for (const auto& [name, ranks, layout] : layouts) {
    SCOPED_TRACE(name);
    const auto losses = logged_losses(temp_dir(name)), aux = logged(temp_dir(name), "aux_loss");
    ASSERT_EQ(losses.size(), 10u);
    double worst = 0;
    for (size_t s = 0; s < losses.size(); ++s) worst = std::max(worst, std::abs(aux[s] - ref.aux_losses[s]) / ref.aux_losses[s]);
    if (name == "moe_fsdp2_micro") {
      EXPECT_GT(worst, 1e-4) << "each rank's own aux loss is not the global batch's";
      continue;
    }
    for (size_t s = 0; s < losses.size(); ++s) {
      EXPECT_NEAR(losses[s], ref.losses[s], 1e-5 * ref.losses[s]) << "step " << s + 1;
      EXPECT_NEAR(aux[s], ref.aux_losses[s], 1e-5 * ref.aux_losses[s]) << "aux, step " << s + 1;
    }
    std::cout << name << ": largest relative aux difference to the plain model " << worst << "\n";
  }
  for (const auto& [name, ranks, layout] : layouts) fs::remove_all(temp_dir(name));
}

// Expert parallelism through the trainer, 20 steps each against the plain model (total and
// aux loss, global scope): EP alone, EP with FSDP over the experts (edp), EP over the ranks of
// a tensor-parallel group (with and without sequence parallelism), EP under HSDP and the
// grouped_experts override (under FSDP and under EP), and layer units of 3 and 1 over nested
// expert units (their backward prefetch order) with activation checkpointing.
TEST(TrainerExperts, ExpertParallelLayoutsMatchThePlainModel) {
  const std::string kGroupedExperts = "plan_overrides=[{match: '*.mlp', module_type: Qwen3MoeSparseMoeBlock, replace_module: grouped_experts}]";
  const std::vector<std::string> moe = {"model_name_or_path=qwen3-moe-debug", "max_steps=20", "learning_rate=3.0e-3"};
  const std::vector<std::tuple<std::string, int, std::vector<std::string>>> layouts = {
      {"ep2", 2, {"per_device_train_batch_size=4", "accelerator.ep_size=2"}},
      {"ep4", 4, {"per_device_train_batch_size=2", "accelerator.ep_size=4"}},
      {"ep2_edp2", 4, {"per_device_train_batch_size=2", "accelerator.ep_size=2", "fsdp_config.edp_shard_size=2"}},
      {"ep2_tp2_sp", 4, {"per_device_train_batch_size=4", "accelerator.ep_size=2", "accelerator.tp_size=2", "accelerator.sequence_parallel=true"}},
      {"ep2_hsdp", 4, {"per_device_train_batch_size=2", "accelerator.ep_size=2", "fsdp_config.dp_shard_size=2"}},
      {"ep2_tp2", 4, {"per_device_train_batch_size=4", "accelerator.ep_size=2", "accelerator.tp_size=2"}},
      {"grouped_fsdp2", 2, {"per_device_train_batch_size=4", kGroupedExperts}},
      {"ep2_grouped", 2, {"per_device_train_batch_size=4", "accelerator.ep_size=2", kGroupedExperts}},
      {"ep2_units3_ac", 2, {"per_device_train_batch_size=4", "accelerator.ep_size=2", "fsdp_config.layers_per_unit=3",
                            "activation_checkpoint.mode=full"}}};
  for (const auto& [name, ranks, layout] : layouts) {
    std::vector<std::string> extra = moe;
    extra.insert(extra.end(), layout.begin(), layout.end());
    train_on(ranks, temp_dir(name), extra, 20);
  }
  std::vector<std::string> overrides = base_overrides(temp_dir("ep_plain"));
  overrides.insert(overrides.end(), moe.begin(), moe.end());
  overrides.push_back("per_device_train_batch_size=8");
  const hp::testing::PlainRun ref = hp::testing::plain_reference_run(hp::train::load_train_config("", overrides));
  ASSERT_EQ(ref.aux_losses.size(), 20u);
  for (const auto& [name, ranks, layout] : layouts) {
    SCOPED_TRACE(name);
    const auto losses = logged_losses(temp_dir(name)), aux = logged(temp_dir(name), "aux_loss");
    ASSERT_EQ(losses.size(), 20u);
    for (size_t s = 0; s < losses.size(); ++s) {
      EXPECT_NEAR(losses[s], ref.losses[s], 1e-5 * ref.losses[s]) << "step " << s + 1;
      EXPECT_NEAR(aux[s], ref.aux_losses[s], 1e-5 * ref.aux_losses[s]) << "aux, step " << s + 1;
    }
  }
  for (const auto& [name, ranks, layout] : layouts) fs::remove_all(temp_dir(name));
}

// A capacity factor drops pairs per micro-batch: FSDP2, EP2 and EP2 x TP2 with sequence
// parallelism see the same micro-batches, so they drop the same pairs (the logged fraction)
// and train alike.
TEST(TrainerExperts, ExpertCapacityDropsTheSamePairsOnEveryLayout) {
  const std::vector<std::string> moe = {"model_name_or_path=qwen3-moe-debug", "max_steps=10", "learning_rate=3.0e-3",
                                        "moe_capacity_factor=1.0", "per_device_train_batch_size=4"};
  const std::vector<std::tuple<std::string, int, std::vector<std::string>>> layouts = {
      {"capacity_fsdp2", 2, {}},
      {"capacity_ep2", 2, {"accelerator.ep_size=2"}},
      {"capacity_ep2_tp2_sp", 4, {"accelerator.ep_size=2", "accelerator.tp_size=2", "accelerator.sequence_parallel=true"}}};
  for (const auto& [name, ranks, layout] : layouts) {
    std::vector<std::string> extra = moe;
    extra.insert(extra.end(), layout.begin(), layout.end());
    train_on(ranks, temp_dir(name), extra, 10);
  }
  const auto ref = logged_losses(temp_dir("capacity_fsdp2"));
  const auto ref_dropped = logged(temp_dir("capacity_fsdp2"), "moe_dropped_fraction");
  ASSERT_EQ(ref_dropped.size(), 10u);
  EXPECT_GT(ref_dropped.front(), 0.01);
  for (const auto& [name, ranks, layout] : layouts) {
    SCOPED_TRACE(name);
    const auto losses = logged_losses(temp_dir(name)), dropped = logged(temp_dir(name), "moe_dropped_fraction");
    ASSERT_EQ(losses.size(), 10u);
    for (size_t s = 0; s < losses.size(); ++s) {
      EXPECT_NEAR(losses[s], ref[s], 1e-5 * ref[s]) << "step " << s + 1;
      EXPECT_NEAR(dropped[s], ref_dropped[s], 1e-12) << "step " << s + 1;
    }
  }
  for (const auto& [name, ranks, layout] : layouts) fs::remove_all(temp_dir(name));
}

// Activation checkpointing through the trainer changes no number: full on one process, every
// second layer and selective (both policies) under FSDP2, LlamaFactory's gradient_checkpointing under
// FSDP2 x TP2 + SP, selective (op) under TP2 + SP, and a Qwen3-MoE under EP2, full and selective
// (the experts' FSDP unit recomputed inside its layer), each against
// the plain model; disable_gradient_checkpointing contradicting a mode is a UserError.
TEST(TrainerMemory, ActivationCheckpointingTrainsAsThePlainModel) {
  const std::vector<std::string> moe = {"model_name_or_path=qwen3-moe-debug", "learning_rate=3.0e-3"};
  const std::vector<std::tuple<std::string, int, std::vector<std::string>, bool>> layouts = {
      {"ac_one_process", 1, {"per_device_train_batch_size=8", "activation_checkpoint.mode=full"}, false},
      {"ac_fsdp2_every2", 2, {"per_device_train_batch_size=4", "activation_checkpoint.mode=full", "activation_checkpoint.every=2"}, false},
      {"ac_fsdp2_selective", 2, {"per_device_train_batch_size=4", "activation_checkpoint.mode=selective"}, false},
      {"ac_fsdp2_selective_core", 2, {"per_device_train_batch_size=4", "activation_checkpoint.mode=selective",
                                      "activation_checkpoint.selective_policy=attention_core"}, false},
      {"ac_tp2_sp_selective", 2, {"per_device_train_batch_size=8", "activation_checkpoint.mode=selective", "accelerator.tp_size=2",
                                  "accelerator.sequence_parallel=true"}, false},
      {"ac_fsdp2_tp2_sp", 4, {"per_device_train_batch_size=4", "gradient_checkpointing=true", "accelerator.tp_size=2", "accelerator.sequence_parallel=true"}, false},
      {"ac_moe_ep2", 2, {"per_device_train_batch_size=4", "activation_checkpoint.mode=full", "accelerator.ep_size=2"}, true},
      {"ac_moe_ep2_selective", 2, {"per_device_train_batch_size=4", "activation_checkpoint.mode=selective", "accelerator.ep_size=2"}, true},
      {"ac_fsdp2_swap", 2, {"per_device_train_batch_size=4", "activation_checkpoint.mode=full", "activation_checkpoint.swap_inputs=true"}, false},
      {"ac_moe_ep2_swap", 2, {"per_device_train_batch_size=4", "gradient_checkpointing=true", "activation_checkpoint.swap_inputs=true",
                              "accelerator.ep_size=2"}, true}};
  for (const auto& [name, ranks, layout, is_moe] : layouts) {
    std::vector<std::string> extra = layout;
    if (is_moe) extra.insert(extra.end(), moe.begin(), moe.end());
    extra.push_back("max_steps=20");
    train_on(ranks, temp_dir(name), extra, 20);
  }
  std::map<bool, hp::testing::PlainRun> refs;
  for (bool is_moe : {false, true}) {
    std::vector<std::string> overrides = base_overrides(temp_dir("ac_plain"));
    if (is_moe) overrides.insert(overrides.end(), moe.begin(), moe.end());
    overrides.push_back("max_steps=20");
    overrides.push_back("per_device_train_batch_size=8");
    refs[is_moe] = hp::testing::plain_reference_run(hp::train::load_train_config("", overrides));
  }
  for (const auto& [name, ranks, layout, is_moe] : layouts) {
    SCOPED_TRACE(name);
    const auto losses = logged_losses(temp_dir(name));
    const auto& ref = refs.at(is_moe);
    ASSERT_EQ(losses.size(), 20u);
    for (size_t s = 0; s < losses.size(); ++s) EXPECT_NEAR(losses[s], ref.losses[s], 1e-5 * ref.losses[s]) << "step " << s + 1;
    if (name.find("swap") != std::string::npos) {  // every kept input went out and came back
      const auto swapped = nlohmann::json::parse(std::ifstream(temp_dir(name) + "/train_summary.json")).at("activation_swap_rank0");
      EXPECT_GT(swapped.at("bytes_out").get<int64_t>(), 0);
      EXPECT_EQ(swapped.at("bytes_in"), swapped.at("bytes_out"));
    }
    fs::remove_all(temp_dir(name));
  }
  std::vector<std::string> contradiction = base_overrides(temp_dir("ac_contradiction"));
  contradiction.push_back("activation_checkpoint.mode=full");
  contradiction.push_back("disable_gradient_checkpointing=true");
  try {
    hp::train::load_train_config("", contradiction);
    ADD_FAILURE() << "a contradiction was accepted";
  } catch (const hp::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("disable_gradient_checkpointing: true contradicts activation_checkpoint.mode: full; keep one"),
              std::string::npos) << e.what();
  }
}

// The chunked loss through the trainer: one process, FSDP2 x TP2 with loss parallelism (the
// vocab-sharded cross-entropy on each chunk) and TP2 + SP with activation checkpointing, each
// against the plain model.
TEST(TrainerMemory, ChunkedLossTrainsAsThePlainModel) {
  const std::vector<std::tuple<std::string, int, std::vector<std::string>>> layouts = {
      {"chunked_one_process", 1, {"per_device_train_batch_size=8", "chunked_loss.chunk_size=50"}},
      {"chunked_fsdp2_tp2_lp", 4, {"per_device_train_batch_size=4", "accelerator.tp_size=2", "accelerator.loss_parallel=true"}},
      {"chunked_tp2_sp_ac", 2, {"per_device_train_batch_size=8", "accelerator.tp_size=2", "accelerator.sequence_parallel=true",
                                "activation_checkpoint.mode=full"}}};
  for (const auto& [name, ranks, layout] : layouts) {
    std::vector<std::string> extra = layout;
    extra.insert(extra.end(), {"chunked_loss.enabled=true", "max_steps=20"});
    train_on(ranks, temp_dir(name), extra, 20);
  }
  std::vector<std::string> overrides = base_overrides(temp_dir("chunked_plain"));
  overrides.insert(overrides.end(), {"max_steps=20", "per_device_train_batch_size=8"});
  const hp::testing::PlainRun ref = hp::testing::plain_reference_run(hp::train::load_train_config("", overrides));
  for (const auto& [name, ranks, layout] : layouts) {
    SCOPED_TRACE(name);
    const auto losses = logged_losses(temp_dir(name));
    ASSERT_EQ(losses.size(), 20u);
    for (size_t s = 0; s < losses.size(); ++s) EXPECT_NEAR(losses[s], ref.losses[s], 1e-5 * ref.losses[s]) << "step " << s + 1;
    if (name.find("swap") != std::string::npos) {  // every kept input went out and came back
      const auto swapped = nlohmann::json::parse(std::ifstream(temp_dir(name) + "/train_summary.json")).at("activation_swap_rank0");
      EXPECT_GT(swapped.at("bytes_out").get<int64_t>(), 0);
      EXPECT_EQ(swapped.at("bytes_in"), swapped.at("bytes_out"));
    }
    fs::remove_all(temp_dir(name));
  }
}

TEST(TrainerExperts, ExpertParallelLayoutsThatDoNotFitAreUserErrors) {
  const std::vector<std::tuple<int, std::vector<std::string>, std::string>> misfits = {
      {2, {"accelerator.ep_size=2"}, "accelerator.ep_size 2 divides the experts of a mixture-of-experts model, and qwen3 has none; set ep_size: 1"},
      {3, {"model_name_or_path=qwen3-moe-debug", "accelerator.ep_size=3"},
       "accelerator.ep_size 3 does not divide the model's num_experts (8); valid ep sizes: 1, 2, 4, 8"},
      {2, {"model_name_or_path=qwen3-moe-debug", "accelerator.ep_size=4"},
       "accelerator.ep_size / fsdp_config.edp_shard_size: ep(4) does not divide dp_shard(2) x cp(1) x tp(1) = 2"},
      {4, {"model_name_or_path=qwen3-moe-debug", "accelerator.ep_size=2", "fsdp_config.edp_shard_size=4"},
       "edp_shard(4) x ep(2) = 8 != dp_shard(4) x cp(1) x tp(1) = 4; set edp_shard_size: -1 to infer it"},
      {2, {"model_name_or_path=qwen3-moe-debug", "accelerator.ep_size=2", "fsdp_config.replicate_params=['*.experts.*']"},
       "fsdp_config.replicate_params: '*.experts.*' matches only expert parameters"}};
  expect_user_errors_before_training(misfits, "ep_misfit");
}

// optimizer_offload.dir: the same run with AdamW's moments in a file, bit for bit, and the
// file gone afterwards (unlinked when mapped).
TEST(TrainerMemory, OptimizerOffloadTrainsBitIdentically) {
  const std::string dir = temp_dir("offload_files");
  if (!hp::testing::is_rank_process()) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  // fp32, and bf16 compute (the fp32 master shards in the file too).
  for (const std::string dtype : {"float32", "bfloat16"}) {
    SCOPED_TRACE(dtype);
    const std::string mp = "fsdp_config.mix_precision.param_dtype=" + dtype;
    train_on(2, temp_dir("in_memory_" + dtype), {"per_device_train_batch_size=4", mp});
    train_on(2, temp_dir("offloaded_" + dtype), {"per_device_train_batch_size=4", mp, "optimizer_offload.dir=" + dir});
    EXPECT_EQ(logged_losses(temp_dir("offloaded_" + dtype)), logged_losses(temp_dir("in_memory_" + dtype)));
    EXPECT_EQ(logged(temp_dir("offloaded_" + dtype), "grad_norm"), logged(temp_dir("in_memory_" + dtype), "grad_norm"));
    EXPECT_TRUE(fs::is_empty(dir));
    for (const auto& d : {temp_dir("in_memory_" + dtype), temp_dir("offloaded_" + dtype)}) fs::remove_all(d);
  }
  fs::remove_all(dir);
}

TEST(TrainerLayouts, ContextParallelLayoutsThatDoNotFitAreUserErrors) {
  const std::vector<std::tuple<int, std::vector<std::string>, std::string>> misfits = {
      {3, {"accelerator.cp_size=2"}, "accelerator.tp_size 1 x cp_size 2 = 2 does not divide the world size 3"},
      {4, {"accelerator.cp_size=4", "accelerator.cp_algorithm=ulysses"},
       "Ulysses degree 4 must divide each rank's 4 attention heads and 2 kv heads (4 and 2 over 1 tensor-parallel ranks); "
       "valid degrees for 4 cp ranks: 1, 2; or use cp_algorithm ring or allgather"},
      {4, {"accelerator.cp_size=2", "accelerator.tp_size=2", "accelerator.cp_algorithm=ulysses"},
       "must divide each rank's 2 attention heads and 1 kv heads (4 and 2 over 2 tensor-parallel ranks); valid degrees for 2 cp ranks: 1"}};
  expect_user_errors_before_training(misfits, "cp_misfit");
}

// The eval loss (eval_dataset, uneven micro-batches of 3 rows per rank) before training, every
// 5 steps and at the end: the same on every layout as the plain model's one forward over all
// eval rows.
TEST(TrainerLayouts, EvalLossMatchesThePlainModelOnEveryLayout) {
  const std::vector<std::string> eval = {"eval_dataset=synthetic_addition", "per_device_eval_batch_size=3", "eval_on_start=true",
                                         "eval_strategy=steps", "eval_steps=5", "max_samples=50"};
  const std::vector<std::tuple<std::string, int, std::vector<std::string>>> layouts = {
      {"eval_one_process", 1, {"per_device_train_batch_size=8"}},
      {"eval_fsdp2_accum2", 2, {"per_device_train_batch_size=2", "gradient_accumulation_steps=2"}},
      {"eval_fsdp2_tp2", 4, {"per_device_train_batch_size=4", "accelerator.tp_size=2", "accelerator.sequence_parallel=true"}},
      {"eval_pp2_fsdp2", 4, {"per_device_train_batch_size=2", "gradient_accumulation_steps=2", "accelerator.pp_size=2"}}};
  std::vector<std::vector<std::pair<int64_t, double>>> got;
  for (const auto& [name, ranks, layout] : layouts) {
    std::vector<std::string> overrides = base_overrides(temp_dir(name));
    overrides.insert(overrides.end(), eval.begin(), eval.end());
    overrides.insert(overrides.end(), layout.begin(), layout.end());
    if (!hp::testing::is_rank_process()) fs::remove_all(temp_dir(name));
    hp::testing::run_on_ranks(ranks, [&](hp::testing::RankContext& ctx) {
      std::ostringstream log;
      const auto result = hp::train::run_training(hp::train::load_train_config("", overrides), ctx.world, log);
      std::ofstream(temp_dir(name) + "/eval_losses_rank" + std::to_string(ctx.rank) + ".json") << nlohmann::json(result.eval_losses).dump();
    });
    got.push_back(nlohmann::json::parse(std::ifstream(temp_dir(name) + "/eval_losses_rank0.json")).get<std::vector<std::pair<int64_t, double>>>());
  }
  std::vector<std::string> overrides = base_overrides(temp_dir("eval_plain"));
  overrides.insert(overrides.end(), eval.begin(), eval.end());
  overrides.push_back("per_device_train_batch_size=8");
  const hp::testing::PlainRun ref = hp::testing::plain_reference_run(hp::train::load_train_config("", overrides));
  ASSERT_EQ(ref.eval_losses.size(), 5u);  // steps 0, 5, 10, 15, 20
  EXPECT_LT(ref.eval_losses.back().second, ref.eval_losses.front().second);
  for (size_t l = 0; l < layouts.size(); ++l) {
    SCOPED_TRACE(std::get<0>(layouts[l]));
    ASSERT_EQ(got[l].size(), ref.eval_losses.size());
    for (size_t i = 0; i < got[l].size(); ++i) {
      EXPECT_EQ(got[l][i].first, ref.eval_losses[i].first);
      EXPECT_NEAR(got[l][i].second, ref.eval_losses[i].second, 1e-5 * ref.eval_losses[i].second) << "step " << got[l][i].first;
    }
    // The trainer_log line of each evaluation.
    std::ifstream in(temp_dir(std::get<0>(layouts[l])) + "/trainer_log.jsonl");
    int64_t eval_lines = 0;
    for (std::string line; std::getline(in, line);) eval_lines += nlohmann::json::parse(line).contains("eval_loss");
    EXPECT_EQ(eval_lines, 5);
  }
  for (const auto& [name, ranks, layout] : layouts) fs::remove_all(temp_dir(name));
}

// Tensor-parallel layouts through the trainer (qwen3-debug: tied embeddings, q/k norms, 2 kv
// heads), and Validation mode, which checks every boundary and changes no number.
TEST(TrainerLayouts, TensorParallelLayoutsMatchThePlainModel) {
  const std::vector<std::tuple<std::string, int, std::vector<std::string>>> layouts = {
      {"tp2", 2, {"per_device_train_batch_size=8", "accelerator.tp_size=2"}},
      {"tp2_sp", 2, {"per_device_train_batch_size=8", "accelerator.tp_size=2", "accelerator.sequence_parallel=true"}},
      {"tp2_sp_lp", 2, {"per_device_train_batch_size=8", "accelerator.tp_size=2", "accelerator.sequence_parallel=true",
                        "accelerator.loss_parallel=true"}},
      {"fsdp2_tp2_sp", 4, {"per_device_train_batch_size=4", "accelerator.tp_size=2", "accelerator.sequence_parallel=true"}},
      {"hsdp2x1_tp2", 4, {"per_device_train_batch_size=4", "accelerator.tp_size=2", "fsdp_config.dp_shard_size=1"}},
      {"tp4_accum2", 4, {"per_device_train_batch_size=4", "gradient_accumulation_steps=2", "accelerator.tp_size=4"}},
      {"tp2_sp_lp_validated", 2, {"per_device_train_batch_size=8", "accelerator.tp_size=2", "accelerator.sequence_parallel=true",
                                  "accelerator.loss_parallel=true", "model.validate_placement=true"}}};
  expect_layouts_match_the_plain_model(layouts);
  EXPECT_EQ(logged_losses(temp_dir("tp2_sp_lp_validated")), logged_losses(temp_dir("tp2_sp_lp")));
  EXPECT_EQ(logged(temp_dir("tp2_sp_lp_validated"), "grad_norm"), logged(temp_dir("tp2_sp_lp"), "grad_norm"));
  for (const auto& [name, ranks, layout] : layouts) fs::remove_all(temp_dir(name));
}

// Context parallelism through the trainer, 20 steps against the plain model: every algorithm
// (qwen3-debug: 4 heads, 2 kv heads, so Ulysses up to 2), with FSDP over dp_shard x cp, with TP
// and sequence parallelism, with activation checkpointing, on packed rows, and Qwen3-MoE with
// the global aux loss, alone and with expert parallelism (each in its own test: a rank
// process runs the body up to its own run_on_ranks call, plain references included).
TEST(TrainerLayouts, ContextParallelLayoutsMatchThePlainModel) {
  const std::string cp2 = "accelerator.cp_size=2", cp4 = "accelerator.cp_size=4";
  expect_runs_match_the_plain_model(
      {}, {{"cp2_ring", 2, {"per_device_train_batch_size=8", cp2}},
           {"cp2_ulysses", 2, {"per_device_train_batch_size=8", cp2, "accelerator.cp_algorithm=ulysses"}},
           {"cp4_allgather", 4, {"per_device_train_batch_size=8", cp4, "accelerator.cp_algorithm=allgather"}},
           {"cp4_hybrid", 4, {"per_device_train_batch_size=8", cp4, "accelerator.cp_algorithm=hybrid", "accelerator.ulysses_degree=2"}},
           {"fsdp2_cp2", 4, {"per_device_train_batch_size=4", cp2}},
           {"tp2_cp2_sp", 4, {"per_device_train_batch_size=8", cp2, "accelerator.tp_size=2", "accelerator.sequence_parallel=true"}},
           {"cp2_ring_checkpointed", 2, {"per_device_train_batch_size=8", cp2, "activation_checkpoint.mode=full"}}},
      20);
}

TEST(TrainerLayouts, ContextParallelLayoutsMatchThePlainModelOnPackedRows) {
  const std::string cp2 = "accelerator.cp_size=2";
  expect_runs_match_the_plain_model({"packing=true"}, {{"cp2_ring_packed", 2, {"per_device_train_batch_size=8", cp2}},
                                                        {"fsdp2_cp2_allgather_packed", 4, {"per_device_train_batch_size=4", cp2,
                                                                                           "accelerator.cp_algorithm=allgather"}}},
                                    20);
}

TEST(TrainerLayouts, ContextParallelMoeLayoutsMatchThePlainModel) {
  const std::string cp2 = "accelerator.cp_size=2";
  expect_runs_match_the_plain_model({"model_name_or_path=qwen3-moe-debug", "learning_rate=3.0e-3"},
                                    {{"moe_cp2", 2, {"per_device_train_batch_size=8", cp2}},
                                     {"moe_cp2_ep2", 4, {"per_device_train_batch_size=4", cp2, "accelerator.ep_size=2"}}},
                                    20);
}

// optim: muon through the trainer: Muon's matrices orthogonalised whole on their owner ranks
// under FSDP4, HSDP 2x2 and FSDP2 x TP2 + SP, against a one-process Muon.
TEST(TrainerLayouts, MuonLayoutsMatchThePlainModel) {
  expect_runs_match_the_plain_model({"optim=muon", "muon_config.momentum=0.9"},
                                    {{"muon_fsdp4", 4, {"per_device_train_batch_size=2"}},
                                     {"muon_hsdp", 4, {"per_device_train_batch_size=2", "fsdp_config.dp_shard_size=2"}},
                                     {"muon_fsdp2_tp2_sp", 4, {"per_device_train_batch_size=4", "accelerator.tp_size=2",
                                                               "accelerator.sequence_parallel=true"}}},
                                    20);
}
