// `hyperparallel run`: torchrun's environment, prefixed output, and the whole job ends
// when one rank fails or the launcher is interrupted — with the rank named, within 15 s,
// and no process left behind.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <regex>

#include "hyperparallel/platform/blas_check.h"
#include "support/subprocess.h"

namespace hyperparallel {
namespace {

using testing::processes_with;
using testing::run_subprocess;

// A sleep whose argument is unique to this test process, to find leftovers in /proc.
std::string marker() { return "300." + std::to_string(getpid()); }

std::vector<std::string> run_cli(int nproc, const std::string& script) {
  return {HP_CLI_PATH, "run", "--nproc-per-node", std::to_string(nproc), "--", "sh", "-c", script};
}

TEST(Launcher, RanksGetTorchrunEnvironmentAndPrefixedOutput) {
  const auto r = run_subprocess(
      run_cli(2, "echo r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK lw=$LOCAL_WORLD_SIZE a=$MASTER_ADDR p=$MASTER_PORT; echo err >&2"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(\[rank 0\] r=0 w=2 l=0 lw=2 a=127\.0\.0\.1 p=[0-9]+)")))
      << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(\[rank 1\] r=1 w=2 l=1 lw=2 a=127\.0\.0\.1 p=[0-9]+)")))
      << r.output;
  EXPECT_NE(r.output.find("[rank 1] err"), std::string::npos) << r.output;
}

TEST(Launcher, APortTheLauncherPicksIsReservedBeforeRankZeroStarts) {
  // Rank 0 inherits the bound socket (its descriptor in HP_STORE_LISTEN_FD), so no other
  // process can bind the port between the launcher picking it and rank 0's store serving it.
  const std::string done = "/tmp/hp_launcher_test." + std::to_string(getpid());
  const std::string script =
      "if ! python3 -c \"import os, socket; socket.socket().bind(('127.0.0.1', int(os.environ['MASTER_PORT'])))\" 2>/dev/null; "
      "then echo reserved; fi; "
      "if [ -n \"$HP_STORE_LISTEN_FD\" ] && [ -S /proc/self/fd/$HP_STORE_LISTEN_FD ]; then echo socket; fi; "
      "echo fd=$HP_STORE_LISTEN_FD.; "
      // rank 0 holds the socket: it stays until rank 1 has looked
      "if [ $RANK = 1 ]; then touch " + done + "; else for i in $(seq 200); do [ -e " + done + " ] && break; sleep 0.1; done; fi";
  const auto r = run_subprocess(run_cli(2, script));
  std::remove(done.c_str());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] reserved"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] reserved"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 0] socket"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] fd=."), std::string::npos) << r.output;  // rank 0's alone
  // A port the user names is rank 0's to bind: nothing is handed down.
  const auto named = run_subprocess({HP_CLI_PATH, "run", "--nproc-per-node", "1", "--master-port", "29517", "--", "sh",
                                     "-c", "echo fd=$HP_STORE_LISTEN_FD."});
  EXPECT_NE(named.output.find("[rank 0] fd=."), std::string::npos) << named.output;
}

// The launcher runs a PyTorch script as torchrun would: torch.distributed's env:// rendezvous
// binds MASTER_PORT in rank 0 (the port the launcher reserved, not listening) and both ranks
// all-reduce through Gloo.
TEST(Launcher, RunsAPyTorchScriptThatInitialisesAProcessGroup) {
  if (std::string(HP_PYTHON_PATH).empty()) GTEST_SKIP() << "built against a LibTorch without the project's Python environment";
  const std::string script =
      "import os, torch, torch.distributed as dist\n"
      "dist.init_process_group('gloo')\n"
      "t = torch.tensor([float(dist.get_rank() + 1)])\n"
      "dist.all_reduce(t)\n"
      "print(f'rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item():g}')\n"
      "dist.destroy_process_group()\n";
  const auto r = run_subprocess({HP_CLI_PATH, "run", "--nproc-per-node", "2", "--", HP_PYTHON_PATH, "-c", script},
                                {std::chrono::seconds(120)});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] rank 0 of 2 sum 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] rank 1 of 2 sum 3"), std::string::npos) << r.output;
}

TEST(Launcher, RanksShareTheCoresForOpenMpAndBlas) {
  testing::SubprocessOptions options;
  options.unset_env = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"};
  const long share = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN) / 2);
  const auto r = run_subprocess(run_cli(2, "echo omp=$OMP_NUM_THREADS blas=$OPENBLAS_NUM_THREADS"), options);
  EXPECT_NE(r.output.find("[rank 1] omp=" + std::to_string(share) + " blas=" + std::to_string(share)), std::string::npos)
      << r.output;
  options.unset_env.clear();
  options.env = {{"OMP_NUM_THREADS", "7"}};  // the user's choice wins
  const auto mine = run_subprocess(run_cli(2, "echo omp=$OMP_NUM_THREADS"), options);
  EXPECT_NE(mine.output.find("[rank 0] omp=7"), std::string::npos) << mine.output;
}

TEST(Launcher, ARankExitingNonZeroStopsTheJobNamingTheRank) {
  const auto r = run_subprocess(
      run_cli(3, "if [ \"$RANK\" = 1 ]; then sleep 0.5; exit 3; fi; exec sleep " + marker()));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_LT(r.seconds, 15.0);
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(rank 1 \(pid [0-9]+\) exited with code 3)"))) << r.output;
  EXPECT_TRUE(processes_with(marker()).empty()) << "orphans left behind";
}

TEST(Launcher, ARankKilledBySigkillStopsTheJobNamingTheRank) {
  const auto r = run_subprocess(
      run_cli(3, "if [ \"$RANK\" = 2 ]; then sleep 0.5; kill -9 $$; fi; exec sleep " + marker()));
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.output;
  EXPECT_LT(r.seconds, 15.0);
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(rank 2 \(pid [0-9]+\) was killed by signal 9 \(SIGKILL\))")))
      << r.output;
  EXPECT_TRUE(processes_with(marker()).empty()) << "orphans left behind";
}

// A rank killed by SIGPIPE wrote to a peer that had gone: the launcher waits briefly for the
// failure that caused it and names that one; alone, the SIGPIPE death is named.
TEST(Launcher, ASigpipeDeathIsNotTakenForTheRootCause) {
  const auto r = run_subprocess(run_cli(
      3, "if [ \"$RANK\" = 0 ]; then sleep 0.3; kill -PIPE $$; fi; if [ \"$RANK\" = 1 ]; then sleep 1; exit 3; fi; exec sleep " +
             marker()));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(rank 1 \(pid [0-9]+\) exited with code 3)"))) << r.output;
  EXPECT_TRUE(processes_with(marker()).empty()) << "orphans left behind";
  const auto alone = run_subprocess(run_cli(2, "if [ \"$RANK\" = 0 ]; then sleep 0.3; kill -PIPE $$; fi; exec sleep " + marker()));
  EXPECT_EQ(alone.exit_code, 128 + SIGPIPE) << alone.output;
  EXPECT_TRUE(std::regex_search(alone.output, std::regex(R"(rank 0 \(pid [0-9]+\) was killed by signal 13 \(SIGPIPE\))")))
      << alone.output;
  EXPECT_LT(alone.seconds, 15.0);
  EXPECT_TRUE(processes_with(marker()).empty()) << "orphans left behind";
}

// Rank 0 unwinding from a user error closes its store before it exits, and a peer fails its
// next collective on that: the user error (exit 2) is the one named, and the job's exit code.
TEST(Launcher, AUserErrorOutranksTheFailuresItCaused) {
  const auto r = run_subprocess(run_cli(
      3, "if [ \"$RANK\" = 1 ]; then sleep 0.2; exit 1; fi; if [ \"$RANK\" = 0 ]; then sleep 0.6; exit 2; fi; exec sleep " +
             marker()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(rank 0 \(pid [0-9]+\) exited with code 2)"))) << r.output;
  EXPECT_LT(r.seconds, 15.0);
  EXPECT_TRUE(processes_with(marker()).empty()) << "orphans left behind";
}

TEST(Launcher, ARankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  // Rank 0 fails; rank 1 ignores SIGTERM, so only the SIGKILL 10 s later ends it.
  const auto r = run_subprocess(
      run_cli(2, "if [ \"$RANK\" = 0 ]; then sleep 0.5; exit 5; fi; trap '' TERM; exec sleep " + marker()));
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_GE(r.seconds, 9.0);
  // 10 s of grace by design, plus process start-up, which a loaded 2-core machine stretches.
  EXPECT_LT(r.seconds, 25.0) << r.output;
  EXPECT_TRUE(processes_with(marker()).empty()) << "orphans left behind";
}

TEST(Launcher, SigintToTheLauncherReachesEveryRank) {
  testing::SubprocessOptions options;
  options.signal_when = testing::SubprocessOptions::SignalWhen{"ready", 3, SIGINT, ""};
  const auto r = run_subprocess(run_cli(3, "echo ready; exec sleep " + marker()), options);
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.output;
  EXPECT_LT(r.seconds, 15.0);
  EXPECT_NE(r.output.find("received SIGINT; stopped all 3 local rank(s)"), std::string::npos) << r.output;
  EXPECT_TRUE(processes_with(marker()).empty()) << "orphans left behind";
}

TEST(Launcher, ACommandThatCannotRunIsReported) {
  const auto r = run_subprocess({HP_CLI_PATH, "run", "--nproc-per-node", "2", "--", "/nonexistent/program"});
  EXPECT_EQ(r.exit_code, 127) << r.output;
  EXPECT_NE(r.output.find("cannot execute the command: /nonexistent/program"), std::string::npos) << r.output;
}

// torchrun's spellings of a static single-node job.
TEST(Launcher, TorchrunsRendezvousOptionsAreAccepted) {
  const auto standalone = run_subprocess({HP_CLI_PATH, "run", "--standalone", "--nproc_per_node=2", "--", "sh", "-c", "echo w=$WORLD_SIZE"});
  EXPECT_EQ(standalone.exit_code, 0) << standalone.output;
  EXPECT_NE(standalone.output.find("[rank 1] w=2"), std::string::npos) << standalone.output;
  const auto endpoint = run_subprocess({HP_CLI_PATH, "run", "--rdzv-backend=c10d", "--rdzv-id", "job7", "--rdzv_endpoint=127.0.0.1:0",
                                        "--nproc-per-node", "2", "--", "sh", "-c", "echo a=$MASTER_ADDR"});
  EXPECT_EQ(endpoint.exit_code, 0) << endpoint.output;
  EXPECT_NE(endpoint.output.find("[rank 0] a=127.0.0.1"), std::string::npos) << endpoint.output;
}

// One process gets a compute thread per CPU when OpenBLAS shares LibTorch's OpenMP pool, and
// OMP_NUM_THREADS (the user's, or the launcher's per-rank share) always wins.
TEST(Launcher, ComputeThreadsAreOnePerCpuUnlessOmpNumThreadsSays) {
  const int before = at::get_num_threads();
  const char* env = std::getenv("OMP_NUM_THREADS");
  const std::string saved = env ? env : "";
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  ::unsetenv("OMP_NUM_THREADS");
  at::set_num_threads(1);
  EXPECT_EQ(hyperparallel::platform::configure_compute_threads(), hyperparallel::platform::loaded_blas().uses_openmp ? cpus : 1);
  ::setenv("OMP_NUM_THREADS", "1", 1);
  at::set_num_threads(1);
  EXPECT_EQ(hyperparallel::platform::configure_compute_threads(), 1);
  if (env) {
    ::setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  } else {
    ::unsetenv("OMP_NUM_THREADS");
  }
  at::set_num_threads(before);
}

// The kernel set OpenBLAS runs is read from OpenBLAS itself: the one OPENBLAS_CORETYPE names
// when it is set (benchmarks record it with their numbers). The wheel's MKL is named as such.
TEST(Launcher, LoadedBlasNamesOpenBlasKernelSet) {
  const auto blas = hyperparallel::platform::loaded_blas();
  if (blas.library == "mkl") {  // the torch wheel: MKL inside libtorch_cpu, on ATen's OpenMP pool
    EXPECT_TRUE(blas.uses_openmp);
    EXPECT_EQ(blas.kernels.rfind("mkl/", 0), 0u) << blas.kernels;
    EXPECT_GT(blas.kernels.size(), 4u) << blas.kernels;
    return;
  }
  if (blas.path.find("openblas") == std::string::npos) GTEST_SKIP() << "not OpenBLAS: " << blas.path;
  EXPECT_FALSE(blas.kernels.empty());
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced && *forced) {
    EXPECT_EQ(strcasecmp(blas.kernels.c_str(), forced), 0) << blas.kernels << " vs " << forced;
  }
}

// Every subcommand answers --help (its synopsis; train adds its keys) and --version, exit 0.
TEST(Launcher, EverySubcommandAnswersHelpAndVersion) {
  for (const std::string command : {"run", "selfcheck", "tokenize", "train", "train-tokenizer", "export", "generate"}) {
    SCOPED_TRACE(command);
    const auto help = run_subprocess({HP_CLI_PATH, command, "--help"});
    EXPECT_EQ(help.exit_code, 0) << help.output;
    EXPECT_EQ(help.output.rfind("usage: hyperparallel " + command + " ", 0), 0u) << help.output;
    const auto version = run_subprocess({HP_CLI_PATH, command, "--version"});
    EXPECT_EQ(version.exit_code, 0) << version.output;
    EXPECT_TRUE(std::regex_match(version.output, std::regex("hyperparallel [0-9]+\\.[0-9]+\\.[0-9]+\n"))) << version.output;
  }
  const auto train = run_subprocess({HP_CLI_PATH, "train", "cfg.yaml", "-h"});
  EXPECT_NE(train.output.find("  fsdp_config.dp_shard_size: int, -1 or >= 1 = -1\n"), std::string::npos) << train.output;
  EXPECT_NE(train.output.find("  lr_scheduler_kwargs: mapping = {}\n"), std::string::npos) << train.output;
  EXPECT_EQ(run_subprocess({HP_CLI_PATH, "help", "export"}).output, run_subprocess({HP_CLI_PATH, "export", "--help"}).output);
  const auto top = run_subprocess({HP_CLI_PATH, "--version"});
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_EQ(top.output, run_subprocess({HP_CLI_PATH, "train", "--version"}).output);
  // A --help after run's command belongs to that command.
  const auto child = run_subprocess({HP_CLI_PATH, "run", "--nproc-per-node", "1", "--no-prefix", "--", "sh", "-c", "echo \"$0\"", "--help"});
  EXPECT_EQ(child.output, "--help\n");
}

TEST(Launcher, BadArgumentsExitWithCode2) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--nproc-per-node", "0", "--", "true"}, "--nproc-per-node '0' is not an integer >= 1"},
      {{"--nproc-per-node", "two", "--", "true"}, "--nproc-per-node 'two' is not an integer >= 1"},
      {{"--nnodes", "2", "--", "true"}, "--nnodes 2 needs --master-addr"},
      {{"--nnodes", "2", "--master-addr", "10.0.0.1", "--", "true"}, "needs --master-port"},
      {{"--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "--master-port", "1", "--", "true"},
       "--node-rank 2 must be in [0, 2)"},
      {{"--nproc-per-node", "2"}, "no command to run; put it after '--'"},
      {{"--bogus", "--", "true"}, "unknown option --bogus"},
      {{"--rdzv-endpoint", ":29500", "--", "true"}, "--rdzv-endpoint ':29500' has no host"},
      {{"--rdzv-backend", "etcd", "--", "true"}, "--rdzv-backend etcd is not supported"},
      {{"--nnodes", "2", "--standalone", "--", "true"}, "--standalone is a single-node job"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv = {HP_CLI_PATH, "run"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    const auto r = run_subprocess(argv);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace hyperparallel
