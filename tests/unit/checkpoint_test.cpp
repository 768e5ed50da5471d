// Checkpoints: resuming continues the uninterrupted run exactly on the same layout and within
// 1e-5 on another (4 -> 2 ranks, 2 -> 1), `latest` never picks an unfinished save,
// save_total_limit prunes, and damaged or mismatched checkpoints are refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <csignal>
#include <fstream>
#include <thread>
#include <nlohmann/json.hpp>

#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/io/safetensors.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/models/model_config.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/train/checkpoint.h"
#include "hyperparallel/train/trainer.h"
#include "support/multiprocess.h"
#include "support/subprocess.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;

namespace {

std::string temp_dir(const std::string& name) { return ::testing::TempDir() + "hp_checkpoint_" + name; }

// The debug model, global batch 8, 12 steps with warmup and cosine decay, a checkpoint every 4
// steps (the last two kept).
std::vector<std::string> overrides(const std::string& output_dir, std::vector<std::string> extra) {
  std::vector<std::string> o = {"model_name_or_path=qwen3-debug", "tokenizer=" HP_SOURCE_DIR "/examples/tokenizer",
                                "dataset=synthetic_reverse",      "template=qwen3",
                                "max_samples=200",                "cutoff_len=64",
                                "learning_rate=3.0e-3",           "lr_scheduler_type=cosine",
                                "warmup_steps=2",                 "weight_decay=0.01",
                                "max_grad_norm=1.0",              "max_steps=12",
                                "logging_steps=1",                "save_steps=4",
                                "save_total_limit=2",             "seed=11",
                                "overwrite_output_dir=true",       "output_dir=" + output_dir};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

void train_on(int ranks, const std::string& output_dir, const std::vector<std::string>& extra, bool fresh = true) {
  const auto config = hp::train::load_train_config("", overrides(output_dir, extra));
  if (fresh && !hp::testing::is_rank_process()) fs::remove_all(output_dir);
  hp::testing::run_on_ranks(ranks, [&](hp::testing::RankContext& ctx) {
    std::ostringstream log;
    hp::train::run_training(config, ctx.world, log);
  });
}

// The losses of trainer_log.jsonl in `output_dir` (or of the .jsonl file `output_dir` names).
std::map<int64_t, double> logged_losses(const std::string& output_dir) {
  std::ifstream in(fs::path(output_dir).extension() == ".jsonl" ? output_dir : output_dir + "/trainer_log.jsonl");
  std::map<int64_t, double> losses;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;  // the cut line a test writes on purpose
    losses[j.at("step").get<int64_t>()] = j.at("loss").get<double>();
  }
  return losses;
}

// The 12-step run in `full` (checkpoint-8) against runs resumed from it: `same` (its own
// layout) equal step for step, each of `others` (4 steps) within 1e-5; the models exported to
// `exports` equal the one exported to `one` (which is among `others`).
void expect_resumed_runs_agree(const std::string& full, const std::string& same, const std::vector<std::string>& others,
                               const std::string& one, const std::vector<std::string>& exports) {
  const auto reference = logged_losses(full);
  ASSERT_EQ(reference.size(), 12u);
  for (const auto& [step, loss] : logged_losses(same)) EXPECT_EQ(loss, reference.at(step)) << "step " << step;
  for (const auto& dir : others) {
    SCOPED_TRACE(dir);
    const auto resumed = logged_losses(dir);
    ASSERT_EQ(resumed.size(), 4u);
    for (const auto& [step, loss] : resumed) EXPECT_NEAR(loss, reference.at(step), 1e-5 * reference.at(step)) << "step " << step;
  }
  const auto a = hp::io::SafetensorsFile(one + "/model.safetensors");
  for (const auto& dir : exports) {
    const auto b = hp::io::SafetensorsFile(dir + "/model.safetensors");
    ASSERT_EQ(a.entries().size(), b.entries().size()) << dir;
    for (const auto& e : a.entries()) EXPECT_TRUE(at::allclose(a.read(e.name), b.read(e.name), 1e-5, 1e-6)) << dir << " " << e.name;
  }
}

std::string user_error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const hp::UserError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Checkpoint, ResumeContinuesExactlyAndReshardsOntoOtherLayouts) {
  const std::string full = temp_dir("full4");
  train_on(4, full, {"per_device_train_batch_size=2"});
  // Same layout from checkpoint-8; 2 ranks (per-rank batch 4), 1 process and other FSDP units
  // from it too.
  const std::string same = temp_dir("same4"), two = temp_dir("two"), one = temp_dir("one");
  const std::string from = full + "/checkpoint-8";
  train_on(4, same, {"per_device_train_batch_size=2", "resume_from_checkpoint=" + from});
  train_on(2, two, {"per_device_train_batch_size=4", "resume_from_checkpoint=" + from});
  train_on(1, one, {"per_device_train_batch_size=8", "resume_from_checkpoint=" + from});
  // Other FSDP units over the same ranks: 3 layers and 1 per unit instead of one each.
  const std::string units3 = temp_dir("units3");
  train_on(4, units3, {"per_device_train_batch_size=2", "fsdp_config.layers_per_unit=3", "resume_from_checkpoint=" + from});

  // save_total_limit=2 kept the last two of 4, 8, 12.
  EXPECT_EQ(hp::train::list_checkpoints(full), (std::vector<std::string>{full + "/checkpoint-8", full + "/checkpoint-12"}));
  const auto reference = logged_losses(full);
  ASSERT_EQ(reference.size(), 12u);
  const auto resumed_same = logged_losses(same);
  ASSERT_EQ(resumed_same.size(), 4u);  // steps 9..12
  for (const auto& [step, loss] : resumed_same) EXPECT_EQ(loss, reference.at(step)) << "step " << step;
  for (const auto& dir : {two, one, units3}) {
    SCOPED_TRACE(dir);
    const auto resumed = logged_losses(dir);
    ASSERT_EQ(resumed.size(), 4u);
    for (const auto& [step, loss] : resumed) EXPECT_NEAR(loss, reference.at(step), 1e-5 * reference.at(step)) << "step " << step;
  }
  // The same final parameters: the exported models agree.
  const auto a = hp::io::SafetensorsFile(full + "/model.safetensors");
  const auto b = hp::io::SafetensorsFile(same + "/model.safetensors");
  const auto c = hp::io::SafetensorsFile(two + "/model.safetensors");
  for (const auto& e : a.entries()) {
    EXPECT_TRUE(at::equal(a.read(e.name), b.read(e.name))) << e.name;
    EXPECT_TRUE(at::allclose(a.read(e.name), c.read(e.name), 1e-5, 1e-6)) << e.name;
  }
  for (const auto& dir : {same, two, one, units3}) fs::remove_all(dir);
}

// A checkpoint written by the build before the move to LibTorch 2.11 (1.13.1 + OpenBLAS;
// tests/fixtures/checkpoint_libtorch_1_13/README.md) resumes on this one: on its own layout
// and on one process, steps 5-8 give the old run's losses (the format is ours: safetensors and
// JSON, no LibTorch serialisation).
TEST(Checkpoint, ACheckpointWrittenOnLibTorch113Resumes) {
  const std::string fixture = HP_SOURCE_DIR "/tests/fixtures/checkpoint_libtorch_1_13";
  const std::string copy = temp_dir("from_1_13_input");
  if (!hp::testing::is_rank_process()) {
    fs::remove_all(copy);
    fs::create_directories(copy);
    fs::copy(fixture + "/checkpoint-4", copy + "/checkpoint-4");  // the fixture stays untouched
  }
  const std::vector<std::string> base = {"model_name_or_path=" HP_SOURCE_DIR "/tests/fixtures/hf/qwen3", "max_steps=8",
                                         "resume_from_checkpoint=" + copy + "/checkpoint-4"};
  const std::string two = temp_dir("from_1_13_two"), one = temp_dir("from_1_13_one");
  std::vector<std::string> layout = base;
  layout.push_back("per_device_train_batch_size=4");
  train_on(2, two, layout);
  layout = base;
  layout.push_back("per_device_train_batch_size=8");
  train_on(1, one, layout);
  const auto old_run = logged_losses(fixture + "/trainer_log_1_13.jsonl");
  ASSERT_EQ(old_run.size(), 8u);
  for (const auto& dir : {two, one}) {
    SCOPED_TRACE(dir);
    const auto resumed = logged_losses(dir);
    ASSERT_EQ(resumed.size(), 4u);  // steps 5..8
    for (const auto& [step, loss] : resumed) EXPECT_NEAR(loss, old_run.at(step), 1e-5 * old_run.at(step)) << "step " << step;
  }
  for (const auto& dir : {copy, two, one}) fs::remove_all(dir);
}

// Elements of "param/*" over every rank file of a checkpoint.
int64_t parameter_elements_written(const std::string& dir) {
  int64_t total = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    hp::io::SafetensorsFile file(entry.path().string());
    for (const auto& e : file.entries()) {
      if (e.name.rfind("param/", 0) != 0) continue;
      int64_t n = 1;
      for (int64_t d : e.shape) n *= d;
      total += n;
    }
  }
  return total;
}

// A checkpoint written by FSDP2 x TP2 with sequence parallelism holds each element once (N-D
// boxes, no replica writes twice) and resumes exactly on its own layout and within 1e-5 on
// TP4, FSDP4 and one process; an HSDP x TP checkpoint also holds each element once.
TEST(Checkpoint, TensorParallelCheckpointsLoadOnAnyLayout) {
  const std::string full = temp_dir("fsdp2_tp2");
  const std::vector<std::string> tp_layout = {"per_device_train_batch_size=4", "accelerator.tp_size=2",
                                               "accelerator.sequence_parallel=true"};
  train_on(4, full, tp_layout);
  const std::string from = full + "/checkpoint-8";
  const std::string same = temp_dir("same_tp"), tp4 = temp_dir("tp4"), fsdp4 = temp_dir("fsdp4"), one = temp_dir("one_tp");
  std::vector<std::string> resume_same = tp_layout;
  resume_same.push_back("resume_from_checkpoint=" + from);
  train_on(4, same, resume_same);
  train_on(4, tp4, {"per_device_train_batch_size=8", "accelerator.tp_size=4", "resume_from_checkpoint=" + from});
  train_on(4, fsdp4, {"per_device_train_batch_size=2", "resume_from_checkpoint=" + from});
  train_on(1, one, {"per_device_train_batch_size=8", "resume_from_checkpoint=" + from});
  const std::string hsdp = temp_dir("hsdp_tp");
  train_on(4, hsdp, {"per_device_train_batch_size=4", "accelerator.tp_size=2", "fsdp_config.dp_shard_size=1", "max_steps=4"});

  const int64_t model_elements = hp::models::debug_flavour_config("qwen3-debug").parameter_count();
  EXPECT_EQ(parameter_elements_written(from), model_elements);
  EXPECT_EQ(parameter_elements_written(hsdp + "/checkpoint-4"), model_elements);
  // The models exported from the TP layouts equal the one exported by one process.
  expect_resumed_runs_agree(full, same, {tp4, fsdp4, one}, one, {full, same, tp4});
  for (const auto& dir : {full, same, tp4, fsdp4, one, hsdp}) fs::remove_all(dir);
}

// A checkpoint written by FSDP2 x CP2 (FSDP over the four dp_shard x cp ranks) holds each
// element once, resumes exactly on its own layout and within 1e-5 on CP4 (ring of four), on
// FSDP without CP and on one process; the exported folders are the same model.
TEST(Checkpoint, ContextParallelCheckpointsLoadOnAnyLayout) {
  const std::string full = temp_dir("fsdp2_cp2");
  const std::vector<std::string> cp_layout = {"per_device_train_batch_size=4", "accelerator.cp_size=2",
                                               "accelerator.cp_algorithm=allgather"};
  train_on(4, full, cp_layout);
  const std::string from = full + "/checkpoint-8";
  const std::string same = temp_dir("same_cp"), cp4 = temp_dir("cp4"), fsdp4 = temp_dir("fsdp4_from_cp"), one = temp_dir("one_cp");
  std::vector<std::string> resume_same = cp_layout;
  resume_same.push_back("resume_from_checkpoint=" + from);
  train_on(4, same, resume_same);
  train_on(4, cp4, {"per_device_train_batch_size=8", "accelerator.cp_size=4", "resume_from_checkpoint=" + from});
  train_on(4, fsdp4, {"per_device_train_batch_size=2", "resume_from_checkpoint=" + from});
  train_on(1, one, {"per_device_train_batch_size=8", "resume_from_checkpoint=" + from});
  // Other FSDP units over the same ranks: 3 layers and 1 per unit instead of one each.
  const std::string units3 = temp_dir("units3");
  train_on(4, units3, {"per_device_train_batch_size=2", "fsdp_config.layers_per_unit=3", "resume_from_checkpoint=" + from});

  EXPECT_EQ(parameter_elements_written(from), hp::models::debug_flavour_config("qwen3-debug").parameter_count());
  expect_resumed_runs_agree(full, same, {cp4, fsdp4, one}, one, {full, same, cp4});
  for (const auto& dir : {full, same, cp4, fsdp4, one}) fs::remove_all(dir);
}

// Pipeline stages save their own parameters; the checkpoint of pp2 x FSDP2 resumes exactly on
// its own layout and within 1e-5 on pp4, on plain FSDP2 and on one process; every export (the
// stages gathered to rank 0) holds the same weights.
TEST(Checkpoint, PipelineCheckpointsLoadOnAnyPipelineSize) {
  const std::string full = temp_dir("pp2_fsdp2");
  const std::vector<std::string> pp_layout = {"per_device_train_batch_size=2", "gradient_accumulation_steps=2", "accelerator.pp_size=2"};
  train_on(4, full, pp_layout);
  const std::string from = full + "/checkpoint-8";
  const std::string same = temp_dir("same_pp"), pp4 = temp_dir("pp4"), fsdp2 = temp_dir("fsdp2_from_pp"), one = temp_dir("one_pp");
  std::vector<std::string> resume_same = pp_layout;
  resume_same.push_back("resume_from_checkpoint=" + from);
  train_on(4, same, resume_same);
  train_on(4, pp4, {"per_device_train_batch_size=2", "gradient_accumulation_steps=4", "accelerator.pp_size=4",
                    "resume_from_checkpoint=" + from});
  train_on(2, fsdp2, {"per_device_train_batch_size=4", "resume_from_checkpoint=" + from});
  train_on(1, one, {"per_device_train_batch_size=8", "resume_from_checkpoint=" + from});
  // Other FSDP units over the same ranks: 3 layers and 1 per unit instead of one each.
  const std::string units3 = temp_dir("units3");
  train_on(4, units3, {"per_device_train_batch_size=2", "fsdp_config.layers_per_unit=3", "resume_from_checkpoint=" + from});

  EXPECT_EQ(parameter_elements_written(from), hp::models::debug_flavour_config("qwen3-debug").parameter_count());
  expect_resumed_runs_agree(full, same, {pp4, fsdp2, one}, one, {full, same, pp4});
  for (const auto& dir : {full, same, pp4, fsdp2, one}) fs::remove_all(dir);
}

// The flagship job (Qwen3-MoE, TP2 + SP x CP2 x EP2 x FSDP2 on 8 ranks) saves a checkpoint that
// resumes exactly on its own layout and within 1e-5 on 4 ranks as TP2 x EP2 and on one process;
// the exports hold the same weights.
TEST(Checkpoint, FlagshipCheckpointsResumeOnTp2Ep2AndOneProcess) {
  const std::string full = temp_dir("flagship_4d");
  const std::vector<std::string> moe = {"model_name_or_path=qwen3-moe-4d-debug"};
  const auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), moe.begin(), moe.end());
    return extra;
  };
  const std::vector<std::string> layout = with({"per_device_train_batch_size=4", "accelerator.tp_size=2", "accelerator.cp_size=2",
                                               "accelerator.ep_size=2", "accelerator.sequence_parallel=true", "fsdp_config.dp_shard_size=2"});
  train_on(8, full, layout);
  const std::string from = full + "/checkpoint-8";
  const std::string same = temp_dir("same_4d"), tp2_ep2 = temp_dir("tp2_ep2_from_4d"), one = temp_dir("one_from_4d");
  std::vector<std::string> resume_same = layout;
  resume_same.push_back("resume_from_checkpoint=" + from);
  train_on(8, same, resume_same);
  train_on(4, tp2_ep2, with({"per_device_train_batch_size=4", "accelerator.tp_size=2", "accelerator.ep_size=2", "resume_from_checkpoint=" + from}));
  train_on(1, one, with({"per_device_train_batch_size=8", "resume_from_checkpoint=" + from}));
  EXPECT_EQ(parameter_elements_written(from), hp::models::debug_flavour_config("qwen3-moe-4d-debug").parameter_count());
  expect_resumed_runs_agree(full, same, {tp2_ep2, one}, one, {full, same, tp2_ep2});
  for (const auto& dir : {full, same, tp2_ep2, one}) fs::remove_all(dir);
}

// optim: muon keeps each matrix's momentum as AdamW's exp_avg: a checkpoint of FSDP2 resumes
// exactly on FSDP2 and within 1e-5 on one process.
TEST(Checkpoint, MuonCheckpointsResume) {
  const std::string full = temp_dir("muon_fsdp2"), same = temp_dir("muon_same"), one = temp_dir("muon_one");
  train_on(2, full, {"per_device_train_batch_size=4", "optim=muon"});
  const std::string from = full + "/checkpoint-8";
  train_on(2, same, {"per_device_train_batch_size=4", "optim=muon", "resume_from_checkpoint=" + from});
  train_on(1, one, {"per_device_train_batch_size=8", "optim=muon", "resume_from_checkpoint=" + from});
  const auto reference = logged_losses(full);
  ASSERT_EQ(reference.size(), 12u);
  const auto resumed = logged_losses(same);
  ASSERT_EQ(resumed.size(), 4u);
  for (const auto& [step, loss] : resumed) EXPECT_EQ(loss, reference.at(step)) << "step " << step;
  for (const auto& [step, loss] : logged_losses(one)) EXPECT_NEAR(loss, reference.at(step), 1e-5 * reference.at(step)) << "step " << step;
  for (const auto& dir : {full, same, one}) fs::remove_all(dir);
}

// A checkpoint written by EP2 x edp2 (each expert on one ep rank, FSDP-sharded over two)
// holds each element once, resumes exactly on its own layout and within 1e-5 on EP4, on FSDP
// without EP and on one process; the exported folders are the same model.
TEST(Checkpoint, ExpertParallelCheckpointsLoadOnAnyLayout) {
  const std::vector<std::string> moe = {"model_name_or_path=qwen3-moe-debug"};
  const auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), moe.begin(), moe.end());
    return extra;
  };
  const std::string full = temp_dir("ep2_edp2");
  const std::vector<std::string> ep_layout = with({"per_device_train_batch_size=2", "accelerator.ep_size=2"});
  train_on(4, full, ep_layout);
  const std::string from = full + "/checkpoint-8";
  const std::string same = temp_dir("same_ep"), ep4 = temp_dir("ep4"), fsdp2 = temp_dir("fsdp2_moe"), one = temp_dir("one_moe");
  std::vector<std::string> resume_same = ep_layout;
  resume_same.push_back("resume_from_checkpoint=" + from);
  train_on(4, same, resume_same);
  train_on(4, ep4, with({"per_device_train_batch_size=2", "accelerator.ep_size=4", "resume_from_checkpoint=" + from}));
  train_on(2, fsdp2, with({"per_device_train_batch_size=4", "resume_from_checkpoint=" + from}));
  train_on(1, one, with({"per_device_train_batch_size=8", "resume_from_checkpoint=" + from}));

  EXPECT_EQ(parameter_elements_written(from), hp::models::debug_flavour_config("qwen3-moe-debug").parameter_count());
  const auto reference = logged_losses(full);
  ASSERT_EQ(reference.size(), 12u);
  for (const auto& [step, loss] : logged_losses(same)) EXPECT_EQ(loss, reference.at(step)) << "step " << step;
  for (const auto& dir : {ep4, fsdp2, one}) {
    SCOPED_TRACE(dir);
    const auto resumed = logged_losses(dir);
    ASSERT_EQ(resumed.size(), 4u);
    for (const auto& [step, loss] : resumed) EXPECT_NEAR(loss, reference.at(step), 1e-5 * reference.at(step)) << "step " << step;
  }
  const auto a = hp::io::SafetensorsFile(one + "/model.safetensors");
  for (const auto& dir : {full, same, ep4}) {
    const auto b = hp::io::SafetensorsFile(dir + "/model.safetensors");
    ASSERT_EQ(a.entries().size(), b.entries().size()) << dir;
    for (const auto& e : a.entries()) EXPECT_TRUE(at::allclose(a.read(e.name), b.read(e.name), 1e-5, 1e-6)) << dir << " " << e.name;
  }
  for (const auto& dir : {full, same, ep4, fsdp2, one}) fs::remove_all(dir);
}

TEST(Checkpoint, LatestSkipsUnfinishedSavesAndResumesInPlace) {
  const std::string dir = temp_dir("latest");
  train_on(2, dir, {"per_device_train_batch_size=4", "max_steps=8"});
  const auto first = logged_losses(dir);
  // A save killed before its state file: a .partial folder, and (by hand) a named folder
  // without trainer_state.json. Neither is chosen.
  if (!hp::testing::is_rank_process()) {
    fs::create_directories(dir + "/checkpoint-10.partial");
    fs::create_directories(dir + "/checkpoint-11");
    std::ofstream(dir + "/trainer_log.jsonl", std::ios::app) << "{\"step\": 9, \"loss\": 0.5}\n{\"step\": 10, \"lo";
  }
  EXPECT_EQ(hp::train::resolve_checkpoint("latest", dir), dir + "/checkpoint-8");
  train_on(2, dir, {"per_device_train_batch_size=4", "resume_from_checkpoint=latest"}, false);
  const auto resumed = logged_losses(dir);
  ASSERT_EQ(resumed.size(), 12u);  // 1..8 kept, the stray 9 and the cut line dropped, 9..12 new
  for (int64_t s = 1; s <= 8; ++s) EXPECT_EQ(resumed.at(s), first.at(s));
  EXPECT_NE(resumed.at(9), 0.5);
  fs::remove_all(dir);
}

// Resuming from an older checkpoint branches off: the later checkpoints of the first run are
// kept under a new name (never deleted by rotation, never taken for "latest"), and rotation
// removes only checkpoints older than the one just written.
TEST(Checkpoint, ResumingFromAnOlderCheckpointLosesNothingOfTheLaterRun) {
  const std::string dir = temp_dir("branch");
  train_on(2, dir, {"per_device_train_batch_size=4", "save_total_limit=3"});  // checkpoints 4, 8, 12
  std::string state12;
  if (!hp::testing::is_rank_process()) {
    std::ifstream in(dir + "/checkpoint-12/trainer_state.json");
    state12.assign(std::istreambuf_iterator<char>(in), {});
  }
  train_on(2, dir,
           {"per_device_train_batch_size=4", "resume_from_checkpoint=" + dir + "/checkpoint-4", "save_total_limit=1",
            "save_steps=2", "max_steps=8"},
           false);
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-8.superseded-4/trainer_state.json"));
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-12.superseded-4/trainer_state.json"));
  std::ifstream in(dir + "/checkpoint-12.superseded-4/trainer_state.json");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), state12) << "the later run's checkpoint changed";
  // This run's line: 6 then 8 written, only the newest kept (limit 1).
  EXPECT_EQ(hp::train::list_checkpoints(dir), std::vector<std::string>{dir + "/checkpoint-8"});
  EXPECT_EQ(hp::train::resolve_checkpoint("latest", dir), dir + "/checkpoint-8");
  EXPECT_EQ(hp::train::read_checkpoint_info(dir + "/checkpoint-8").step, 8);
  EXPECT_EQ(logged_losses(dir).rbegin()->first, 8);  // the log is this run's line too
  fs::remove_all(dir);
}

// A save that fails (here an injected error right after a rank wrote its file; a full disk
// fails the same way) leaves no pieces to keep the disk full, and the next run resumes.
TEST(Checkpoint, AFailedSaveLeavesNothingBehindAndTheRunResumes) {
  const std::string out = temp_dir("failed_save");
  fs::remove_all(out);
  const std::vector<std::string> run = {HP_CLI_PATH, "train", HP_SOURCE_DIR "/examples/demo_sft.yaml", "--heldout_eval_samples=0",
                                        "--max_steps=20", "--save_steps=10", "--nproc_per_node=2", "--fsdp_config.dp_shard_size=-1",
                                        "--tokenizer=" HP_SOURCE_DIR "/examples/tokenizer", "--output_dir=" + out};
  const auto failed = hp::testing::run_subprocess(run, {std::chrono::seconds(120), {{"HP_FAULT_INJECT", "0:checkpoint_file_written:2:throw"}}});
  EXPECT_NE(failed.exit_code, 0) << failed.output;
  EXPECT_TRUE(fs::exists(out + "/checkpoint-10/trainer_state.json")) << failed.output;  // the first save finished
  EXPECT_FALSE(fs::exists(out + "/checkpoint-20.partial")) << "the failed save left its pieces";
  // A save killed outright leaves a .partial folder; the next run that claims the folder sweeps it.
  fs::create_directories(out + "/checkpoint-15.partial");
  std::ofstream(out + "/checkpoint-15.partial/rank-00000.safetensors") << std::string(4096, 'x');
  std::vector<std::string> resume = run;
  resume.push_back("--resume_from_checkpoint=latest");
  const auto resumed = hp::testing::run_subprocess(resume, {std::chrono::seconds(120)});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + out + "/checkpoint-10 at step 10"), std::string::npos) << resumed.output;
  EXPECT_FALSE(fs::exists(out + "/checkpoint-15.partial"));
  EXPECT_TRUE(fs::exists(out + "/checkpoint-20/trainer_state.json"));
  fs::remove_all(out);
}

TEST(Checkpoint, DamagedOrMismatchedCheckpointsAreRefusedByName) {
  const std::string dir = temp_dir("damaged");
  train_on(2, dir, {"per_device_train_batch_size=4", "max_steps=4"});
  const std::string ckpt = dir + "/checkpoint-4";
  auto world = hp::comm::init_process_group(hp::comm::RendezvousInfo{});
  const auto resume = [&](const std::vector<std::string>& changes) {
    std::vector<std::string> extra = {"resume_from_checkpoint=" + ckpt, "max_steps=6"};
    extra.insert(extra.end(), changes.begin(), changes.end());
    const auto config = hp::train::load_train_config("", overrides(temp_dir("damaged_out"), extra));
    std::ostringstream log;
    return user_error_of([&] { hp::train::run_training(config, world, log); });
  };
  EXPECT_NE(resume({"per_device_train_batch_size=4"}).find("a global batch of 8 rows, this run has 4"), std::string::npos);
  EXPECT_NE(resume({"per_device_train_batch_size=8", "seed=12"}).find("seed 11; set seed: 11"), std::string::npos);
  EXPECT_NE(resume({"per_device_train_batch_size=8", "max_samples=150"}).find("data rows"), std::string::npos);
  EXPECT_NE(resume({"per_device_train_batch_size=8", "max_steps=4"}).find("4 steps already"), std::string::npos);
  EXPECT_NE(user_error_of([&] { hp::train::resolve_checkpoint(dir + "/nothing", dir); }).find("is not a folder"), std::string::npos);

  // One flipped byte in a rank file: the checksum names the file.
  {
    std::fstream f(ckpt + "/rank-1.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  auto model = hp::models::AutoModelForCausalLM::from_pretrained("qwen3-debug");
  const std::string damaged = user_error_of([&] { hp::train::load_checkpoint(ckpt, *model, nullptr, 0); });
  EXPECT_NE(damaged.find("rank-1.safetensors does not match its checksum"), std::string::npos) << damaged;
  fs::remove(ckpt + "/trainer_state.json");
  EXPECT_NE(user_error_of([&] { hp::train::resolve_checkpoint(ckpt, dir); }).find("has no trainer_state.json"), std::string::npos);
  fs::remove_all(dir);
  fs::remove_all(temp_dir("damaged_out"));
}

TEST(Checkpoint, KillingTheWholeJobDuringASaveLosesNothing) {
  // kill -9 of the launcher and every rank in the middle of the save of checkpoint-8: rank 1
  // has written its file, rank 0 has not yet written trainer_state.json (an injected fault,
  // fault_injection.h). resume_from_checkpoint: latest must pick checkpoint-6 and reproduce
  // the uninterrupted run's losses exactly.
  const std::string reference = temp_dir("kill_reference"), job = temp_dir("kill_job");
  const auto command = [&](const std::string& out, const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {HP_CLI_PATH, "train"};
    for (const auto& o : overrides(out, {"per_device_train_batch_size=4", "nproc_per_node=2", "save_steps=2", "save_total_limit=3"})) {
      argv.push_back("--" + o);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  };
  fs::remove_all(reference);
  fs::remove_all(job);
  const auto uninterrupted = hp::testing::run_subprocess(command(reference, {}), {std::chrono::seconds(120)});
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;

  // The 4th save is checkpoint-8.
  const hp::testing::SubprocessOptions kill_options{std::chrono::seconds(120), {{"HP_FAULT_INJECT", "1:checkpoint_file_written:4:kill_job"}}};
  const auto killed = hp::testing::run_subprocess(command(job, {}), kill_options);
  EXPECT_EQ(killed.exit_code, 128 + SIGKILL) << killed.output;
  // (rank 1's "injected fault" line may die with the launcher before it is relayed)
  for (int i = 0; i < 50 && !hp::testing::processes_with(job).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(hp::testing::processes_with(job).empty()) << "a rank survived the kill";
  EXPECT_TRUE(fs::exists(job + "/checkpoint-8.partial/rank-1.safetensors")) << "the kill came before the save began";
  EXPECT_FALSE(fs::exists(job + "/checkpoint-8.partial/trainer_state.json"));
  EXPECT_FALSE(fs::exists(job + "/checkpoint-8"));

  const std::string latest = hp::train::resolve_checkpoint("latest", job);
  EXPECT_EQ(latest, job + "/checkpoint-6");
  const auto resumed = hp::testing::run_subprocess(command(job, {"--resume_from_checkpoint=latest"}), {std::chrono::seconds(120)});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + latest), std::string::npos) << resumed.output;
  const auto expected = logged_losses(reference), got = logged_losses(job);
  ASSERT_EQ(got.size(), 12u);
  for (const auto& [step, loss] : expected) EXPECT_EQ(got.at(step), loss) << "step " << step;
  fs::remove_all(reference);
  fs::remove_all(job);
}
