#include "multiprocess.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/launch/process_launcher.h"

namespace hyperparallel::testing {
namespace {

constexpr const char* kCallVar = "HP_TEST_RANKS_CALL";
constexpr const char* kStyleVar = "HP_TEST_RENDEZVOUS";

// The time limit guards against a hang, not a slow run: instrumented code runs 2.5-4x slower
// (TensorParallel's 2-rank parity tests: 49 s under ASan + UBSan alone, over 120 s beside a
// 4-rank suite on 2 cores), so a sanitizer build stretches every limit by this factor.
int time_limit_scale() { return sanitizer_build() ? 3 : 1; }

std::string current_test_name() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(info->test_suite_name()) + "." + info->name();
}

// Which run_on_ranks call of the current test this is (1-based).
int next_call_index() {
  static std::string test;  // test-support bookkeeping only
  static int calls = 0;
  const std::string name = current_test_name();
  if (name != test) {
    test = name;
    calls = 0;
  }
  return ++calls;
}

void move_env(const char* from, const char* to) {
  if (const char* v = std::getenv(from)) setenv(to, v, 1);
  unsetenv(from);
}

// Re-expresses the launcher's torchrun variables in another launcher's vocabulary.
void apply_rendezvous_style(const std::string& style) {
  if (style == "openmpi") {
    move_env("RANK", "OMPI_COMM_WORLD_RANK");
    move_env("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE");
    move_env("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK");
    move_env("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE");
  } else if (style == "slurm") {
    move_env("RANK", "SLURM_PROCID");
    move_env("WORLD_SIZE", "SLURM_NTASKS");
    move_env("LOCAL_RANK", "SLURM_LOCALID");
    unsetenv("LOCAL_WORLD_SIZE");
    setenv("SLURM_NNODES", "1", 1);
  } else if (style == "torchrun_agent") {
    // As torchrun's workers see it: MASTER_PORT is the agent's own TCPStore (the test hosts
    // one and names its port in HP_TEST_AGENT_PORT), announced by TORCHELASTIC_USE_AGENT_STORE.
    setenv("MASTER_PORT", std::getenv("HP_TEST_AGENT_PORT"), 1);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  }
}

[[noreturn]] void finish_rank(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::cout.flush();
  std::cerr.flush();
  _exit(code);
}

}  // namespace

std::string self_exe() {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  path[n > 0 ? n : 0] = '\0';
  return path;
}

bool sanitizer_build() {
  const char* value = std::getenv("HP_SANITIZE_BUILD");
  return value && std::string(value) == "1";
}

bool is_rank_process() { return std::getenv(kCallVar) != nullptr; }

void run_on_ranks(int world_size, const std::function<void(RankContext&)>& body,
                  const MultiProcessOptions& options) {
  const int call = next_call_index();
  if (is_rank_process()) {
    if (std::atoi(std::getenv(kCallVar)) != call) return;
    int rank = -1;
    try {
      apply_rendezvous_style(std::getenv(kStyleVar) ? std::getenv(kStyleVar) : "torchrun");
      const auto info = comm::rendezvous_info_from_env();
      comm::CommOptions comm_options;
      comm_options.timeout = options.collective_timeout;
      comm_options.rendezvous_timeout = std::chrono::seconds(60);
      comm_options.inject_delay_max_ms = options.inject_delay_max_ms;
      RankContext ctx;
      ctx.world = comm::init_process_group(info, comm_options);
      ctx.rank = info.rank;
      ctx.world_size = info.world_size;
      rank = ctx.rank;
      body(ctx);
      // Keep every rank alive until all are done, so no rank sees a peer vanish mid-test.
      ctx.world->barrier().wait();
    } catch (const std::exception& e) {
      std::cerr << "rank " << rank << ": uncaught exception: " << e.what() << std::endl;
      finish_rank(3);
    }
    finish_rank(::testing::Test::HasFailure() ? 1 : 0);
  }

  launch::LaunchSpec spec;
  spec.nproc_per_node = world_size;
  spec.command = {self_exe(), "--gtest_filter=" + current_test_name(), "--gtest_brief=1",
                  "--gtest_also_run_disabled_tests"};
  spec.extra_env = options.env;
  spec.extra_env.emplace_back(kCallVar, std::to_string(call));
  spec.extra_env.emplace_back(kStyleVar, options.rendezvous_style);
  spec.time_limit = options.time_limit * time_limit_scale();
  spec.kill_grace = std::chrono::seconds(5);
  const launch::LaunchResult result = launch::launch_ranks(spec);
  if (result.exit_code != 0) {
    std::string failed;
    for (const auto& r : result.ranks) {
      if (!r.ok() && !r.stopped_by_launcher) failed += "\n  " + r.describe();
    }
    ADD_FAILURE() << "run_on_ranks(" << world_size << ") failed: " << result.summary << failed
                  << "\n(see the [rank k] lines above)";
  }
}

}  // namespace hyperparallel::testing
