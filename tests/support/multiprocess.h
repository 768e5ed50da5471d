// run_on_ranks: runs a test body on N real processes that talk over real sockets.
//
// The test binary re-executes itself once per rank through the launcher
// (src/launch/process_launcher.cpp) with --gtest_filter set to the current test, and the
// ranks rendezvous from torchrun-style variables like any job. In a rank, the k-th
// run_on_ranks call of the test runs its body and then the process exits with the test's
// pass/fail status; every other call is skipped. In the parent, run_on_ranks waits for the
// ranks and fails the test naming each rank that failed (their output carries "[rank k]").
// Failures inside the body use the ordinary EXPECT/ASSERT macros.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hyperparallel/comm/communicator.h"

namespace hyperparallel::testing {

struct RankContext {
  std::shared_ptr<comm::Communicator> world;
  int rank = 0;
  int world_size = 1;
};

struct MultiProcessOptions {
  std::chrono::seconds time_limit{120};  // against a hang; stretched 3x in a sanitizer build
  // How the ranks find each other: "torchrun" (default), "openmpi" or "slurm"; the ranks
  // rewrite their environment into that launcher's variables before the rendezvous.
  // "torchrun_agent": torchrun with its agent's store on HP_TEST_AGENT_PORT (set it in env).
  std::string rendezvous_style = "torchrun";
  std::chrono::milliseconds collective_timeout{60000};
  int inject_delay_max_ms = 0;  // CommOptions::inject_delay_max_ms for the world and its groups
  std::vector<std::pair<std::string, std::string>> env;
};

void run_on_ranks(int world_size, const std::function<void(RankContext&)>& body,
                  const MultiProcessOptions& options = {});

// True in a process started by run_on_ranks.
bool is_rank_process();

// True in the sanitizer build (HP_SANITIZE_BUILD=1 in the environment ctest gives its tests,
// tests/CMakeLists.txt): the test sources compile the same in both builds, so it is told at
// run time, not by a macro.
bool sanitizer_build();

// The path of this test binary (to run it again as a child process).
std::string self_exe();

}  // namespace hyperparallel::testing
