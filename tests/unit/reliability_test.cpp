// A training job under failure: one rank of `hyperparallel train` killed mid-run stops the
// whole job quickly, names the rank, and leaves no process behind.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include "support/subprocess.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;

namespace {

// The value of `name` in a process's environment ("" when absent or unreadable).
std::string environment_of(int pid, const std::string& name) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  for (std::string entry; std::getline(in, entry, '\0');) {
    if (entry.rfind(name + "=", 0) == 0) return entry.substr(name.size() + 1);
  }
  return "";
}

}  // namespace

TEST(Reliability, ATrainingRankKilledMidRunStopsTheJobNamingIt) {
  const std::string out = ::testing::TempDir() + "hp_reliability_kill_rank";
  fs::remove_all(out);
  const std::vector<std::string> argv = {HP_CLI_PATH, "train", HP_SOURCE_DIR "/examples/demo_sft.yaml", "--heldout_eval_samples=0",
                                         "--max_steps=100000", "--logging_steps=1", "--nproc_per_node=3",
                                         "--fsdp_config.dp_shard_size=-1", "--tokenizer=" HP_SOURCE_DIR "/examples/tokenizer",
                                         "--output_dir=" + out};
  hp::testing::SubprocessResult result;
  std::thread job([&] { result = hp::testing::run_subprocess(argv, {std::chrono::seconds(120), {}, {}, {}}); });

  // Wait until training runs (the log has lines), then SIGKILL rank 1 in the middle of a step.
  int victim = 0;
  for (int i = 0; i < 600 && victim == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream log(out + "/trainer_log.jsonl");
    std::string line;
    if (!std::getline(log, line)) continue;
    for (int pid : hp::testing::processes_with(out)) {
      if (environment_of(pid, "RANK") == "1") victim = pid;
    }
  }
  ASSERT_NE(victim, 0) << "rank 1 never started training";
  const auto killed_at = std::chrono::steady_clock::now();
  kill(victim, SIGKILL);
  job.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();

  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_LT(seconds, 60) << result.output;
  EXPECT_NE(result.output.find("rank 1"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("SIGKILL"), std::string::npos) << result.output;
  EXPECT_TRUE(hp::testing::processes_with(out).empty()) << "a rank outlived the job";
  std::cout << "job ended " << seconds << " s after rank 1 was killed\n";
  fs::remove_all(out);
}
