// hyperparallel train: the product promise on the data-parallel layouts (every layout's
// per-step loss and gradient norm equal those of a plain unsharded model at the same global
// batch), torchrun's agent store, the output files, and the command line. The other parallel
// layouts are in trainer_layouts_test.cpp; the shared runs in support/trainer_runs.h.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <nlohmann/json.hpp>

#include "hyperparallel/io/safetensors.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/models/causal_lm.h"
#include "hyperparallel/models/model_config.h"
#include "hyperparallel/platform/bf16_matmul.h"
#include "hyperparallel/platform/cpu_features.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/train/checkpoint.h"
#include "hyperparallel/train/trainer.h"
#include "support/multiprocess.h"
#include "support/plain_reference.h"
#include "support/trainer_runs.h"
#include "train/train_output.h"
#include "support/subprocess.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <thread>

namespace hp = hyperparallel;
namespace fs = std::filesystem;
using namespace hp::testing::trainer_runs;

// fsdp_config.layers_per_unit=3 groups the debug model's 4 layers into units of 3 and 1: the
// same numbers, with 2 fewer reduce-scatters per step than one unit per layer.
TEST(Trainer, EveryLayoutMatchesThePlainModelAtTheSameGlobalBatch) {
  const std::vector<std::tuple<std::string, int, std::vector<std::string>>> layouts = {
      {"one_process", 1, {"per_device_train_batch_size=8"}},
      {"fsdp4", 4, {"per_device_train_batch_size=2"}},
      {"hsdp2x2", 4, {"per_device_train_batch_size=2", "fsdp_config.dp_shard_size=2"}},
      {"fsdp2_accum2", 2, {"per_device_train_batch_size=2", "gradient_accumulation_steps=2"}},
      {"fsdp4_units3", 4, {"per_device_train_batch_size=2", "fsdp_config.layers_per_unit=3"}}};
  expect_layouts_match_the_plain_model(layouts, /*learns=*/true);
  const auto reduce_scatters = [](const std::string& name) {
    const auto summary = nlohmann::json::parse(std::ifstream(temp_dir(name) + "/train_summary.json"));
    return summary.at("comm_per_step_rank0").at("reduce_scatter").at("calls").get<double>();
  };
  EXPECT_EQ(reduce_scatters("fsdp4") - reduce_scatters("fsdp4_units3"), 2.0);
  for (const auto& [name, ranks, layout] : layouts) fs::remove_all(temp_dir(name));
}

// torchrun as its workers see it: the agent (played here by a real c10d TCPStore) serves
// MASTER_PORT and says so with TORCHELASTIC_USE_AGENT_STORE; two `hyperparallel train` ranks
// started with torchrun's variables rendezvous through it and train.
TEST(Trainer, TwoRanksTrainUnderTorchrunsAgentStore) {
  c10d::TCPStoreOptions agent_options;
  agent_options.port = 0;
  agent_options.isServer = true;
  agent_options.waitWorkers = false;
  c10d::TCPStore agent("127.0.0.1", agent_options);
  const std::string dir = temp_dir("torchrun_agent");
  fs::remove_all(dir);
  std::vector<std::string> argv = {HP_CLI_PATH, "train"};
  for (const auto& o : base_overrides(dir)) argv.push_back("--" + o);
  argv.push_back("--max_steps=3");
  argv.push_back("--per_device_train_batch_size=4");
  std::vector<hp::testing::SubprocessResult> ranks(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      hp::testing::SubprocessOptions options(std::chrono::seconds(120),
                                             {{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", std::to_string(r)},
                                              {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                              {"MASTER_PORT", std::to_string(agent.getPort())}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                              {"TORCHELASTIC_RUN_ID", "trainer-test"}, {"TORCHELASTIC_RESTART_COUNT", "0"}});
      ranks[r] = hp::testing::run_subprocess(argv, options);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ranks[r].exit_code, 0) << "rank " << r << ":\n" << ranks[r].output;
  EXPECT_NE(ranks[0].output.find("hyperparallel train: 2 ranks"), std::string::npos) << ranks[0].output;
  EXPECT_EQ(logged_losses(dir).size(), 3u);
  EXPECT_TRUE(agent.check({"hyperparallel/store_address/trainer-test/0"}));
  fs::remove_all(dir);
}

// The real torchrun of the project's environment starts two `hyperparallel train` ranks; they
// rendezvous through its agent store and train to the same losses as under our launcher.
TEST(Trainer, RealTorchrunTrainsTwoRanksToOurLaunchersLosses) {
  const std::string python = HP_PYTHON_PATH;
  if (python.empty()) GTEST_SKIP() << "built against a LibTorch without the project's Python environment";
  const std::string torchrun = fs::path(python).parent_path() / "torchrun";
  const auto train_argv = [](const std::string& dir) {
    std::vector<std::string> argv = {HP_CLI_PATH, "train"};
    for (const auto& o : base_overrides(dir)) argv.push_back("--" + o);
    argv.push_back("--max_steps=3");
    argv.push_back("--per_device_train_batch_size=4");
    return argv;
  };
  const std::string by_torchrun = temp_dir("torchrun_real"), by_ours = temp_dir("torchrun_ours");
  fs::remove_all(by_torchrun);
  fs::remove_all(by_ours);
  std::vector<std::string> argv = {torchrun, "--standalone", "--nproc-per-node", "2", "--no-python"};
  for (const auto& a : train_argv(by_torchrun)) argv.push_back(a);
  const auto run = hp::testing::run_subprocess(argv, {std::chrono::seconds(180)});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("hyperparallel train: 2 ranks"), std::string::npos) << run.output;
  argv = train_argv(by_ours);
  argv.insert(argv.end(), {"--nproc-per-node", "2"});
  const auto ours = hp::testing::run_subprocess(argv, {std::chrono::seconds(180)});
  ASSERT_EQ(ours.exit_code, 0) << ours.output;
  const auto a = logged_losses(by_torchrun), b = logged_losses(by_ours);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6 * std::abs(b[i])) << "step " << i + 1;
  fs::remove_all(by_torchrun);
  fs::remove_all(by_ours);
}

TEST(Trainer, CommandLineTrainsOnItsOwnRanksAndWritesItsFiles) {
  const std::string dir = temp_dir("cli");
  fs::remove_all(dir);
  std::vector<std::string> argv = {HP_CLI_PATH, "train", HP_SOURCE_DIR "/examples/demo_sft.yaml", "--max_steps=6", "--logging_steps=3",
                                   "--output_dir=" + dir, "--nproc-per-node", "2", "--fsdp_config.dp_shard_size=-1", "--tokenizer=" HP_SOURCE_DIR "/examples/tokenizer",
                                   "--heldout_eval_samples=4", "--trace_steps=2"};
  const auto run = hp::testing::run_subprocess(argv, {std::chrono::seconds(120)});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("step 6/6 loss"), std::string::npos) << run.output;
  const auto summary = nlohmann::json::parse(std::ifstream(dir + "/train_summary.json"));
  EXPECT_EQ(summary.at("world_size"), 2);
  EXPECT_EQ(summary.at("steps"), 6);
  EXPECT_EQ(summary.at("peak_rss_bytes").size(), 2u);
  EXPECT_GT(summary.at("comm_per_step_rank0").at("reduce_scatter").at("calls").get<double>(), 0);
  EXPECT_EQ(logged_losses(dir).size(), 2u);
  EXPECT_TRUE(fs::exists(dir + "/training_loss.svg"));
  EXPECT_TRUE(fs::exists(dir + "/training_loss.png")) << "scripts/setup.sh installs rsvg-convert";
  EXPECT_NE(run.output.find("held-out accuracy before training: "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("held-out accuracy after training: "), std::string::npos) << run.output;
  EXPECT_TRUE(summary.contains("heldout_accuracy_after"));
  const double exposed = summary.at("exposed_comm_fraction").get<double>();
  EXPECT_TRUE(exposed > 0 && exposed < 1) << exposed;
  // trace_steps: the last 2 steps of both ranks, with their units' compute, collectives and waits.
  const auto trace = nlohmann::json::parse(std::ifstream(dir + "/trace.json")).at("traceEvents");
  for (int rank : {0, 1}) {
    std::set<std::string> names;
    for (const auto& e : trace) {
      if (e.at("pid") == rank) names.insert(e.at("cat").get<std::string>() + ":" + e.at("name").get<std::string>());
    }
    for (const char* want : {"step:step 5", "step:step 6", "compute:forward root", "compute:backward root",
                             "comm:all_gather on group 'world'", "comm:reduce_scatter on group 'world'", "wait:wait all_gather on group 'world'"}) {
      EXPECT_TRUE(names.count(want)) << "rank " << rank << ": " << want;
    }
    EXPECT_FALSE(names.count("step:step 4")) << "rank " << rank << ": only the last 2 steps";
  }
  // The final checkpoint and the exported Hugging Face folder.
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-6/trainer_state.json"));
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_TRUE(fs::exists(dir + "/" + f)) << f;
  }
  // The same folder again without overwrite_output_dir is refused, and nothing is touched.
  const auto before = fs::last_write_time(dir + "/trainer_log.jsonl");
  argv.push_back("--overwrite_output_dir=false");
  const auto again = hp::testing::run_subprocess(argv, {std::chrono::seconds(120)});
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_NE(again.output.find("already holds a run"), std::string::npos) << again.output;
  EXPECT_EQ(fs::last_write_time(dir + "/trainer_log.jsonl"), before);
  fs::remove_all(dir);
}

TEST(Trainer, ExportAndGenerateFromTheCommandLine) {
  const std::string dir = temp_dir("export");
  fs::remove_all(dir);
  const auto train = hp::testing::run_subprocess(
      {HP_CLI_PATH, "train", HP_SOURCE_DIR "/examples/demo_sft.yaml", "--max_steps=4", "--heldout_eval_samples=0", "--output_dir=" + dir,
       "--nproc_per_node=2", "--fsdp_config.dp_shard_size=-1", "--tokenizer=" HP_SOURCE_DIR "/examples/tokenizer"},
      {std::chrono::seconds(120)});
  ASSERT_EQ(train.exit_code, 0) << train.output;

  // The 2-rank checkpoint exported in one process equals the trainer's own final export, and
  // from_pretrained of it gives the logits of the checkpoint's parameters loaded directly.
  const std::string out = dir + "/exported";
  const auto exported = hp::testing::run_subprocess({HP_CLI_PATH, "export", dir + "/checkpoint-4", out}, {});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_NE(exported.output.find("exported step 4 of qwen3-debug (2 rank shards)"), std::string::npos) << exported.output;
  const hp::io::SafetensorsFile a(out + "/model.safetensors"), b(dir + "/model.safetensors");
  ASSERT_EQ(a.entries().size(), b.entries().size());
  for (const auto& e : a.entries()) EXPECT_TRUE(at::equal(a.read(e.name), b.read(e.name))) << e.name;
  EXPECT_TRUE(fs::exists(out + "/tokenizer.json"));
  auto loaded = hp::models::AutoModelForCausalLM::from_pretrained(out);
  hp::models::ModelLoadOptions deferred;
  deferred.deferred_init = true;
  auto direct = hp::models::AutoModelForCausalLM::from_config(hp::models::load_model_config(dir + "/checkpoint-4"), deferred);
  hp::train::load_checkpoint(dir + "/checkpoint-4", *direct, nullptr, 0);
  hp::models::CausalLMInput in;
  in.input_ids = at::arange(40, at::kLong).view({2, 20});
  EXPECT_TRUE(at::equal(loaded->forward(in).logits, direct->forward(in).logits));

  // generate: greedy is deterministic; bad options are exit code 2.
  const std::vector<std::string> gen = {HP_CLI_PATH, "generate", "--model", out, "--prompt", "Reverse the words: sun tree", "--max-new-tokens", "5"};
  const auto first = hp::testing::run_subprocess(gen, {}), second = hp::testing::run_subprocess(gen, {});
  EXPECT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(first.output, second.output);
  for (const auto& [extra, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--temperature", "hot"}, "--temperature 'hot' is not a number"},
           {{"--template", "chatml"}, "'chatml'"},
           {{"--max-new-tokens", "0"}, "--max-new-tokens '0'"},
           {{"--beam", "2"}, "unknown option '--beam'"}}) {
    auto argv = gen;
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto bad = hp::testing::run_subprocess(argv, {});
    EXPECT_EQ(bad.exit_code, 2) << bad.output;
    EXPECT_NE(bad.output.find(message), std::string::npos) << bad.output;
  }
  const auto refused = hp::testing::run_subprocess({HP_CLI_PATH, "export", dir + "/checkpoint-4", out}, {});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.output.find("is not empty"), std::string::npos) << refused.output;
  const auto missing = hp::testing::run_subprocess({HP_CLI_PATH, "export", dir + "/checkpoint-9", dir + "/x"}, {});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("checkpoint-9 is not a folder"), std::string::npos) << missing.output;
  fs::remove_all(dir);
}

// bf16 through the command line, which installs the caching host allocator (oneDNN's bf16
// matmul frees its scratch through the allocator's raw interface): FSDP mixed precision on
// 2 ranks tracks the fp32 run, and the checkpoint exports and generates. fp16 is refused.
TEST(Trainer, Bf16TrainsExportsAndGeneratesFromTheCommandLine) {
  const std::string dir = temp_dir("bf16");
  fs::remove_all(dir);
  const auto train = [&](const std::string& out, const std::string& bf16) {
    return hp::testing::run_subprocess(
        {HP_CLI_PATH, "train", HP_SOURCE_DIR "/examples/demo_sft.yaml", "--max_steps=6", "--logging_steps=1",
         "--heldout_eval_samples=0", "--output_dir=" + out, "--nproc_per_node=2", "--fsdp_config.dp_shard_size=-1",
         "--bf16=" + bf16, "--tokenizer=" HP_SOURCE_DIR "/examples/tokenizer"},
        {std::chrono::seconds(180)});
  };
  const auto fp32 = train(dir + "/fp32", "false");
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  if (!hp::platform::bf16_matmul_accumulates_in_fp32()) {
    // No AVX-512: LibTorch's bf16 matmul would accumulate in bf16, so bf16: true computes in
    // fp32, says so, and gives the fp32 run's losses; auto picks fp32 too.
    const auto fallback = train(dir + "/bf16", "true");
    ASSERT_EQ(fallback.exit_code, 0) << fallback.output;
    EXPECT_NE(fallback.output.find("bf16: true -> fp32 compute"), std::string::npos) << fallback.output;
    EXPECT_EQ(logged_losses(dir + "/bf16"), logged_losses(dir + "/fp32"));
    const auto automatic = train(dir + "/auto", "auto");
    EXPECT_EQ(automatic.exit_code, 0) << automatic.output;
    EXPECT_NE(automatic.output.find("bf16: auto -> fp32 compute"), std::string::npos) << automatic.output;
    fs::remove_all(dir);
    GTEST_SKIP() << "bf16 compute needs an accurate bf16 matmul (AVX-512); checked the fp32 fallback here";
  }
  const auto bf16 = train(dir + "/bf16", "true");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  const auto want = logged_losses(dir + "/fp32"), got = logged_losses(dir + "/bf16");
  ASSERT_EQ(got.size(), 6u);
  ASSERT_EQ(want.size(), 6u);
  double largest_gap = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 0.03 * want[i]) << "step " << i + 1;
    largest_gap = std::max(largest_gap, std::abs(got[i] - want[i]));
  }
  EXPECT_GT(largest_gap, 0.0) << "bf16 compute must show in the losses";
  EXPECT_LT(got.back(), got.front());
  const std::string exported = dir + "/bf16/exported";
  const auto ex = hp::testing::run_subprocess({HP_CLI_PATH, "export", dir + "/bf16/checkpoint-6", exported}, {});
  ASSERT_EQ(ex.exit_code, 0) << ex.output;
  const auto gen = hp::testing::run_subprocess(
      {HP_CLI_PATH, "generate", "--model", exported, "--prompt", "Reverse the words: sun tree", "--max-new-tokens", "4"}, {});
  EXPECT_EQ(gen.exit_code, 0) << gen.output;
  // auto: the machine's flags decide, and the log says what was chosen.
  const auto automatic = train(dir + "/auto", "auto");
  EXPECT_EQ(automatic.exit_code, 0) << automatic.output;
  const bool fast = hp::platform::cpu_features().fast_bf16();
  EXPECT_NE(automatic.output.find(fast ? "bf16: auto -> bf16 compute" : "bf16: auto -> fp32 compute"), std::string::npos)
      << automatic.output;

  const auto fp16 = hp::testing::run_subprocess(
      {HP_CLI_PATH, "train", HP_SOURCE_DIR "/examples/demo_sft.yaml", "--fp16=true", "--output_dir=" + dir + "/fp16"}, {});
  EXPECT_EQ(fp16.exit_code, 2) << fp16.output;
  EXPECT_NE(fp16.output.find("fp16: true is not supported"), std::string::npos) << fp16.output;
  EXPECT_NE(fp16.output.find("use bf16: true"), std::string::npos) << fp16.output;
  EXPECT_FALSE(fs::exists(dir + "/fp16"));
  fs::remove_all(dir);
}

TEST(Trainer, ProgressBarOnATerminalPlainLinesElsewhere) {
  std::ostringstream plain, terminal;
  for (auto* out : {&plain, &terminal}) {
    hp::train::ProgressDisplay screen(*out, out == &terminal, 4);
    for (int64_t step = 1; step <= 4; ++step) {
      screen.update(step, 1.0 / static_cast<double>(step), 1e-3, 100, 4.0 - static_cast<double>(step));
      if (step % 2 == 0) screen.line("step " + std::to_string(step));
    }
    screen.finish();
  }
  EXPECT_EQ(plain.str(), "step 2\nstep 4\n");
  const std::string t = terminal.str();
  EXPECT_NE(t.find("[###############...............] 2/4 loss 0.5000"), std::string::npos) << t;
  EXPECT_NE(t.find("\x1b[1A\x1b[2Kstep 4\n"), std::string::npos) << t;  // a log line replaces the bar, which is redrawn below
  const std::string last_bar = "[##############################] 4/4 loss 0.2500 lr 0.001 tok/s 100 eta 0s\n";
  ASSERT_GE(t.size(), last_bar.size());
  EXPECT_EQ(t.substr(t.size() - last_bar.size()), last_bar) << t;
}
