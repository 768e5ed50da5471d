// A training job under failure: one rank of `hyperparallel train` killed or frozen mid-run
// stops the whole job quickly, names the rank, and leaves no process behind; hostile clients
// on its store do not stop it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "hyperparallel/launch/free_port.h"
#include "support/local_socket.h"
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

// A 3-rank `hyperparallel train` job of the demo that would run for ever, started in a
// thread; `victim()` waits until it trains (the log has a line) and returns a rank's pid.
class EndlessJob {
 public:
  explicit EndlessJob(const std::string& name, std::vector<std::string> extra = {}) : out_(::testing::TempDir() + name) {
    fs::remove_all(out_);
    std::vector<std::string> argv = {HP_CLI_PATH, "train", HP_SOURCE_DIR "/examples/demo_sft.yaml", "--heldout_eval_samples=0",
                                     "--max_steps=100000", "--logging_steps=1", "--nproc_per_node=3",
                                     "--fsdp_config.dp_shard_size=-1", "--tokenizer=" HP_SOURCE_DIR "/examples/tokenizer",
                                     "--output_dir=" + out_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    thread_ = std::thread([this, argv] { result_ = hp::testing::run_subprocess(argv, {std::chrono::seconds(120)}); });
  }
  ~EndlessJob() {
    if (thread_.joinable()) thread_.join();
    fs::remove_all(out_);
  }
  int victim(int rank) const {
    for (int i = 0; i < 600; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::ifstream log(out_ + "/trainer_log.jsonl");
      std::string line;
      if (!std::getline(log, line)) continue;
      for (int pid : hp::testing::processes_with(out_)) {
        if (environment_of(pid, "RANK") == std::to_string(rank)) return pid;
      }
    }
    return 0;
  }
  // Signals `pid` and waits for the job to end; returns the seconds it took.
  double signal_and_wait(int pid, int signal) {
    const auto at = std::chrono::steady_clock::now();
    kill(pid, signal);
    thread_.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - at).count();
  }
  const hp::testing::SubprocessResult& result() const { return result_; }
  bool leftovers() const { return !hp::testing::processes_with(out_).empty(); }

 private:
  std::string out_;
  hp::testing::SubprocessResult result_;
  std::thread thread_;
};

TEST(Reliability, ATrainingRankKilledMidRunStopsTheJobNamingIt) {
  EndlessJob job("hp_reliability_kill_rank");
  const int victim = job.victim(1);
  ASSERT_NE(victim, 0) << "rank 1 never started training";
  const double seconds = job.signal_and_wait(victim, SIGKILL);  // in the middle of a step
  const auto& result = job.result();
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_LT(seconds, 60) << result.output;
  EXPECT_NE(result.output.find("rank 1"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("SIGKILL"), std::string::npos) << result.output;
  EXPECT_FALSE(job.leftovers()) << "a rank outlived the job";
  std::cout << "job ended " << seconds << " s after rank 1 was killed\n";
}

TEST(Reliability, AFrozenRankIsNamedByTheWatchdogOfTheOthers) {
  // SIGSTOP keeps the rank's sockets open, like a hung process or a host cut off the network:
  // Gloo would wait for it until comm_timeout_s (300 s). The others' watchdogs see its
  // heartbeat stop and end the job after heartbeat_timeout_s.
  EndlessJob job("hp_reliability_freeze_rank", {"--heartbeat_timeout_s=3"});
  const int victim = job.victim(1);
  ASSERT_NE(victim, 0) << "rank 1 never started training";
  const double seconds = job.signal_and_wait(victim, SIGSTOP);
  const auto& result = job.result();
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_GE(seconds, 3) << result.output;
  EXPECT_LT(seconds, 30) << result.output;
  EXPECT_NE(result.output.find("rank 1 stopped responding (no heartbeat for 3 s); ending this rank (heartbeat_timeout_s)"),
            std::string::npos) << result.output;
  EXPECT_FALSE(job.leftovers()) << "a rank outlived the job (the frozen one must be killed too)";
  std::cout << "job ended " << seconds << " s after rank 1 froze\n";
}

TEST(Reliability, AFrozenStoreHostIsReportedByTheWatchdogOfTheOthers) {
  // Rank 0 hosts the rendezvous store; frozen, it neither answers nor closes its connections.
  EndlessJob job("hp_reliability_freeze_rank0", {"--heartbeat_timeout_s=3"});
  const int victim = job.victim(0);
  ASSERT_NE(victim, 0) << "rank 0 never started training";
  const double seconds = job.signal_and_wait(victim, SIGSTOP);
  const auto& result = job.result();
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_LT(seconds, 30) << result.output;
  EXPECT_NE(result.output.find("has not answered for 3 s: rank 0's host is down or cannot be reached"), std::string::npos)
      << result.output;
  EXPECT_FALSE(job.leftovers()) << "a rank outlived the job";
  std::cout << "job ended " << seconds << " s after rank 0 froze\n";
}

namespace {

// A 3-rank demo job of 30 steps (a checkpoint every 10) with HP_FAULT_INJECT=spec
// (fault_injection.h).
hp::testing::SubprocessResult run_with_fault(const std::string& out, const std::string& spec) {
  fs::remove_all(out);
  hp::testing::SubprocessOptions options{std::chrono::seconds(120), {{"HP_FAULT_INJECT", spec}}};
  return hp::testing::run_subprocess({HP_CLI_PATH, "train", HP_SOURCE_DIR "/examples/demo_sft.yaml", "--heldout_eval_samples=0",
                                      "--max_steps=30", "--save_steps=10", "--nproc_per_node=3", "--fsdp_config.dp_shard_size=-1",
                                      "--tokenizer=" HP_SOURCE_DIR "/examples/tokenizer", "--output_dir=" + out},
                                     options);
}

}  // namespace

TEST(Reliability, ARankFailingInForwardBackwardACollectiveOrASaveStopsTheJobNamingIt) {
  // FSDP all-gathers in forward and reduce-scatters in backward: failing at those collectives
  // fails inside forward and inside backward. Killed, exited, or an exception thrown there;
  // and one rank killed in the middle of a checkpoint save.
  struct Case {
    std::string spec, expected_line;
    int exit_code;
  };
  const std::vector<Case> cases = {
      {"1:all_gather:3:kill", "rank 1 (pid", 128 + SIGKILL},
      {"2:reduce_scatter:2:kill", "rank 2 (pid", 128 + SIGKILL},
      {"1:reduce_scatter:4:throw", "failed: injected fault: rank 1 at reduce_scatter #4", 1},
      {"0:all_reduce:2:exit", "rank 0 (pid", 3},
      {"2:checkpoint_file_written:1:kill", "rank 2 (pid", 128 + SIGKILL},  // in the middle of a save
  };
  const std::string out = ::testing::TempDir() + "hp_reliability_injected";
  for (const auto& c : cases) {
    SCOPED_TRACE(c.spec);
    const auto result = run_with_fault(out, c.spec);
    EXPECT_EQ(result.exit_code, c.exit_code) << result.output;
    EXPECT_LT(result.seconds, 60) << result.output;
    EXPECT_NE(result.output.find("injected fault: rank " + c.spec.substr(0, 1)), std::string::npos) << result.output;
    EXPECT_NE(result.output.find(c.expected_line), std::string::npos) << result.output;
    EXPECT_TRUE(hp::testing::processes_with(out).empty()) << "a rank outlived the job";
    std::cout << c.spec << ": job ended after " << result.seconds << " s\n";
  }
  fs::remove_all(out);
}

// A pipeline stage that fails (an exception in a send of its backward, or killed in a receive)
// ends the 2-stage job within a minute, naming the stage or the rank; nobody hangs in a recv.
TEST(Reliability, AFailedPipelineStageEndsTheJobNamingIt) {
  const std::string out = ::testing::TempDir() + "hp_reliability_pipeline";
  for (const auto& [spec, expected] : std::vector<std::pair<std::string, std::string>>{
           {"1:send:3:throw", "pipeline stage 1 (pp rank 1), B of micro-batch"}, {"0:recv:4:kill", "rank 0 (pid"}}) {
    SCOPED_TRACE(spec);
    fs::remove_all(out);
    hp::testing::SubprocessOptions options{std::chrono::seconds(120), {{"HP_FAULT_INJECT", spec}}};
    const auto result = hp::testing::run_subprocess(
        {HP_CLI_PATH, "train", HP_SOURCE_DIR "/examples/demo_sft.yaml", "--heldout_eval_samples=0", "--max_steps=30",
         "--nproc_per_node=2", "--accelerator.pp_size=2", "--gradient_accumulation_steps=2", "--fsdp_config.dp_shard_size=-1",
         "--tokenizer=" HP_SOURCE_DIR "/examples/tokenizer", "--output_dir=" + out},
        options);
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_LT(result.seconds, 60) << result.output;
    EXPECT_NE(result.output.find("injected fault: rank " + spec.substr(0, 1)), std::string::npos) << result.output;
    EXPECT_NE(result.output.find(expected), std::string::npos) << result.output;
    EXPECT_TRUE(hp::testing::processes_with(out).empty()) << "a rank outlived the job";
    std::cout << spec << ": job ended after " << result.seconds << " s\n";
  }
  fs::remove_all(out);
}

TEST(Reliability, ABadFaultSpecIsAUserError) {
  const std::string out = ::testing::TempDir() + "hp_reliability_bad_fault";
  for (const auto& [spec, expected] : std::vector<std::pair<std::string, std::string>>{
           {"1:forward:2", "unknown point 'forward'"},
           {"x:all_gather:1", "RANK 'x' is not an integer >= 0"},
           {"1:all_gather:0", "N '0' is not an integer >= 1"},
           {"1:all_gather:1:explode", "unknown action 'explode'"},
           {"1:all_gather", "it has 2 field(s)"}}) {
    SCOPED_TRACE(spec);
    const auto result = run_with_fault(out, spec);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find("HP_FAULT_INJECT '" + spec + "': " + expected), std::string::npos) << result.output;
    EXPECT_FALSE(fs::exists(out + "/trainer_log.jsonl")) << "the ranks must not start";
  }
  fs::remove_all(out);
}

namespace {

// One frame: [u32 length][payload], the store's wire format.
void send_frame(int fd, const std::string& payload) {
  const uint32_t n = static_cast<uint32_t>(payload.size());
  (void)!send(fd, &n, 4, MSG_NOSIGNAL);
  (void)!send(fd, payload.data(), payload.size(), MSG_NOSIGNAL);
}

std::string str_field(const std::string& s) {
  std::string out(8, '\0');
  const uint64_t n = s.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + s;
}

}  // namespace

// Another local user attacks a running job's store: frames announcing 4 MiB that never come,
// thousands of connect-and-close cycles, garbage, and heartbeat counters overwritten with text.
// The job trains to the end (exit 0) with a 5 s heartbeat watchdog that would end it on a
// wrong verdict; the attack lasts as long as the job.
TEST(Reliability, AJobOutlivesHostileClientsOnItsStore) {
  const std::string out = ::testing::TempDir() + "hp_reliability_hostile_store";
  fs::remove_all(out);
  const int port = hp::launch::find_free_port();  // named, so this test knows where the store is
  std::atomic<bool> done{false};
  hp::testing::SubprocessResult job;
  std::thread runner([&] {
    job = hp::testing::run_subprocess({HP_CLI_PATH, "run", "--nproc-per-node", "2", "--master-port", std::to_string(port), "--",
                                       HP_CLI_PATH, "train", HP_SOURCE_DIR "/examples/demo_sft.yaml", "--heldout_eval_samples=0",
                                       "--max_steps=300", "--heartbeat_timeout_s=5", "--fsdp_config.dp_shard_size=-1",
                                       "--tokenizer=" HP_SOURCE_DIR "/examples/tokenizer", "--output_dir=" + out},
                                      {std::chrono::seconds(240)});
    done = true;
  });
  int probe = -1;
  for (int i = 0; i < 600 && probe < 0 && !done; ++i) {
    probe = hp::testing::connect_local(port);
    if (probe < 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(probe, 0) << "the job's store never came up";
  close(probe);
  std::vector<int> held;
  for (int i = 0; i < 30; ++i) {  // each announces a 4 MiB frame and sends nothing more
    const int fd = hp::testing::connect_local(port);
    const uint32_t announced = (4u << 20) - 1;
    if (fd >= 0 && send(fd, &announced, 4, MSG_NOSIGNAL) == 4) held.push_back(fd);
  }
  int cycles = 0;
  for (int i = 0; !done; ++i) {  // for as long as the job runs
    const int fd = hp::testing::connect_local(port);
    if (fd < 0) continue;
    ++cycles;
    if (i % 100 == 0) send_frame(fd, std::string("\x63garbage", 8));
    if (i % 10 == 0) {  // overwrite both heartbeat counters with text
      for (const char* key : {"hp/alive/0", "hp/alive/1"}) send_frame(fd, std::string(1, '\x01') + str_field(key) + str_field("nope"));
    }
    close(fd);
  }
  runner.join();
  for (int fd : held) close(fd);
  EXPECT_EQ(job.exit_code, 0) << job.output;
  EXPECT_NE(job.output.find("step 300/300"), std::string::npos) << job.output;
  EXPECT_GT(cycles, 1000) << "the attack did not overlap the job";
  std::cout << cycles << " hostile connections during the job\n";
  fs::remove_all(out);
}
