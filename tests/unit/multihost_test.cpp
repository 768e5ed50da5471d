// Two nodes on one machine: network namespaces joined by a veth pair, 2 ranks in each started
// by `hyperparallel run --nnodes 2 --node-rank R --master-addr <veth address>`, training with
// HSDP (replicate across the nodes, shard within each) — the same step losses as 1 process.
// Needs root (CAP_NET_ADMIN) and iproute2; elsewhere it is skipped with the reason, and ctest
// counts it as skipped.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <csignal>
#include <regex>
#include <sstream>
#include <thread>

#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/launch/free_port.h"
#include "hyperparallel/train/trainer.h"
#include "support/subprocess.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;

namespace {

bool sh(const std::vector<std::string>& argv, std::string* output = nullptr) {
  const auto r = hp::testing::run_subprocess(argv, {std::chrono::seconds(20)});
  if (output) *output = r.output;
  return r.exit_code == 0;
}

// Two namespaces A (10.77.0.1) and B (10.77.0.2) joined by a veth pair; removed on scope exit.
class TwoNodeNetwork {
 public:
  TwoNodeNetwork() : a_("hp_node_a_" + std::to_string(::getpid())), b_("hp_node_b_" + std::to_string(::getpid())) {
    const std::string va = "hpva" + std::to_string(::getpid() % 100000);
    vb_ = "hpvb" + std::to_string(::getpid() % 100000);
    const std::string& vb = vb_;
    ok_ = sh({"ip", "netns", "add", a_}, &error_) && sh({"ip", "netns", "add", b_}, &error_) &&
          sh({"ip", "link", "add", va, "type", "veth", "peer", "name", vb}, &error_) &&
          sh({"ip", "link", "set", va, "netns", a_}, &error_) && sh({"ip", "link", "set", vb, "netns", b_}, &error_) &&
          sh({"ip", "-n", a_, "addr", "add", "10.77.0.1/24", "dev", va}, &error_) &&
          sh({"ip", "-n", b_, "addr", "add", "10.77.0.2/24", "dev", vb}, &error_) &&
          sh({"ip", "-n", a_, "link", "set", va, "up"}, &error_) && sh({"ip", "-n", b_, "link", "set", vb, "up"}, &error_) &&
          sh({"ip", "-n", a_, "link", "set", "lo", "up"}, &error_) && sh({"ip", "-n", b_, "link", "set", "lo", "up"}, &error_);
  }
  ~TwoNodeNetwork() {
    sh({"ip", "netns", "del", a_});
    sh({"ip", "netns", "del", b_});
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  // Takes node B's link down: its packets vanish, no connection is closed (a partition).
  bool cut() const { return sh({"ip", "-n", b_, "link", "set", vb_, "down"}); }

 private:
  std::string a_, b_, vb_, error_;
  bool ok_ = false;
};

std::vector<std::string> config_overrides(const std::string& out) {
  return {"model_name_or_path=qwen3-debug", "tokenizer=" HP_SOURCE_DIR "/examples/tokenizer", "dataset=synthetic_reverse",
          "template=qwen3",   "max_samples=200",   "cutoff_len=64",  "learning_rate=3.0e-3", "warmup_steps=1",
          "max_steps=5",      "logging_steps=1",   "seed=3",         "overwrite_output_dir=true", "output_dir=" + out};
}

// `hyperparallel run` of one node of the 2 x 2 job, inside the node's namespace.
std::vector<std::string> node_command(const TwoNodeNetwork& net, int node, int port, const std::vector<std::string>& overrides) {
  std::vector<std::string> argv = {"ip", "netns", "exec", node == 0 ? net.a() : net.b(), HP_CLI_PATH, "run", "--nnodes", "2",
                                   "--node-rank", std::to_string(node), "--nproc-per-node", "2", "--master-addr", "10.77.0.1",
                                   "--master-port", std::to_string(port), "--", HP_CLI_PATH, "train",
                                   "--per_device_train_batch_size=2", "--fsdp_config.dp_shard_size=2"};
  for (const auto& o : overrides) argv.push_back("--" + o);
  return argv;
}

// Both nodes at once, each in its own thread; returns when both have ended.
std::vector<hp::testing::SubprocessResult> run_both_nodes(const TwoNodeNetwork& net, const std::vector<std::string>& overrides) {
  const int port = hp::launch::find_free_port();
  std::vector<hp::testing::SubprocessResult> nodes(2);
  std::vector<std::thread> threads;
  for (int node = 0; node < 2; ++node) {
    threads.emplace_back([&, node] {
      nodes[node] = hp::testing::run_subprocess(node_command(net, node, port, overrides), {std::chrono::seconds(180)});
    });
  }
  for (auto& t : threads) t.join();
  return nodes;
}

// Starts an endless 2 x 2 training, waits until it logs a step, runs `interrupt`, and waits
// for both nodes to end; returns their results and the seconds from the interruption.
std::pair<std::vector<hp::testing::SubprocessResult>, double> interrupt_training(const TwoNodeNetwork& net, const std::string& out,
                                                                                 const std::vector<std::string>& extra,
                                                                                 const std::function<void()>& interrupt) {
  fs::remove_all(out);
  auto overrides = config_overrides(out);
  overrides.push_back("max_steps=100000");
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  std::vector<hp::testing::SubprocessResult> nodes;
  std::thread job([&] { nodes = run_both_nodes(net, overrides); });
  bool training = false;
  for (int i = 0; i < 600 && !training; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream log(out + "/trainer_log.jsonl");
    std::string line;
    training = static_cast<bool>(std::getline(log, line));
  }
  const auto at = std::chrono::steady_clock::now();
  interrupt();
  job.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - at).count();
  fs::remove_all(out);
  EXPECT_TRUE(training) << nodes[0].output;
  return {nodes, seconds};
}

}  // namespace

TEST(MultiHost, TwoNodesInNetworkNamespacesTrainHsdpLikeOneProcess) {
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root (CAP_NET_ADMIN); not run";
  TwoNodeNetwork net;
  if (!net.ok()) GTEST_SKIP() << "cannot create network namespaces here: " << net.error();

  const std::string out = ::testing::TempDir() + "hp_multihost";
  fs::remove_all(out);
  const auto nodes = run_both_nodes(net, config_overrides(out));
  ASSERT_EQ(nodes[0].exit_code, 0) << nodes[0].output;
  ASSERT_EQ(nodes[1].exit_code, 0) << nodes[1].output;
  EXPECT_NE(nodes[0].output.find("(dp_replicate=2, dp_shard=2)"), std::string::npos) << nodes[0].output;

  // The reference: one process with the same global batch of 8 rows.
  auto overrides = config_overrides(out + "_reference");
  overrides.push_back("per_device_train_batch_size=8");
  std::ostringstream log;
  const auto reference = hp::train::run_training(hp::train::load_train_config("", overrides),
                                                 hp::comm::init_process_group(hp::comm::RendezvousInfo{}), log);
  std::ifstream in(out + "/trainer_log.jsonl");
  std::vector<double> losses;
  for (std::string line; std::getline(in, line);) losses.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  ASSERT_EQ(losses.size(), reference.step_losses.size());
  for (size_t s = 0; s < losses.size(); ++s) {
    EXPECT_NEAR(losses[s], reference.step_losses[s], 1e-5 * reference.step_losses[s]) << "step " << s + 1;
  }
  fs::remove_all(out);
  fs::remove_all(out + "_reference");
}

TEST(MultiHost, KillingOneNodeStopsTheOtherNamingItsRanks) {
  // kill -9 of every process of node 1 mid-training: node 0's ranks fail their next collective
  // (the peers' connections close), name ranks 2 and 3 from the store's heartbeats, and its
  // launcher exits non-zero — well within 60 s.
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root (CAP_NET_ADMIN); not run";
  TwoNodeNetwork net;
  if (!net.ok()) GTEST_SKIP() << "cannot create network namespaces here: " << net.error();
  const std::string out = ::testing::TempDir() + "hp_multihost_kill";
  const auto [nodes, seconds] = interrupt_training(net, out, {}, [&] {
    std::string pids;
    sh({"ip", "netns", "pids", net.b()}, &pids);
    std::istringstream list(pids);
    for (int pid; list >> pid;) kill(pid, SIGKILL);
  });
  EXPECT_NE(nodes[0].exit_code, 0) << nodes[0].output;
  EXPECT_LT(seconds, 60);
  EXPECT_TRUE(nodes[0].output.find("rank 2 stopped responding") != std::string::npos ||
              nodes[0].output.find("rank 3 stopped responding") != std::string::npos)
      << nodes[0].output;
  std::cout << "node 0 stopped " << seconds << " s after node 1 was killed\n";
}

TEST(MultiHost, ANodeCutOffTheNetworkIsNoticedOnBothSides) {
  // Node 1's link goes down mid-training: no connection closes, packets just vanish, so
  // Gloo alone would wait comm_timeout_s (300 s). The watchdogs see the silence after
  // heartbeat_timeout_s: node 0 names ranks 2 and 3, node 1 says the store (on node 0) is gone.
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root (CAP_NET_ADMIN); not run";
  TwoNodeNetwork net;
  if (!net.ok()) GTEST_SKIP() << "cannot create network namespaces here: " << net.error();
  const std::string out = ::testing::TempDir() + "hp_multihost_cut";
  const auto [nodes, seconds] = interrupt_training(net, out, {"heartbeat_timeout_s=5"}, [&] { ASSERT_TRUE(net.cut()); });
  EXPECT_NE(nodes[0].exit_code, 0) << nodes[0].output;
  EXPECT_NE(nodes[1].exit_code, 0) << nodes[1].output;
  EXPECT_GE(seconds, 4);
  EXPECT_LT(seconds, 60);
  // Both are named when their last heartbeats fell in the same reading; otherwise the first.
  EXPECT_TRUE(std::regex_search(nodes[0].output, std::regex("watchdog on rank [01]: rank [23](, rank 3)? stopped responding "
                                                            "\\(no heartbeat for 5 s\\)")))
      << nodes[0].output;
  EXPECT_NE(nodes[1].output.find("has not answered for 5 s: rank 0's host is down or cannot be reached"), std::string::npos)
      << nodes[1].output;
  std::cout << "both nodes stopped " << seconds << " s after the link went down\n";
}
