// Process launcher: starts the local ranks of a job as child processes with torchrun's
// environment, relays their output line by line with a "[rank k] " prefix, and ends the job
// as a whole.
//
// Lifecycle: every child runs in its own process group (so a rank's own children are
// signalled with it) and dies with the launcher (PR_SET_PDEATHSIG). When one rank exits
// non-zero or by a signal, or the launcher itself gets SIGINT/SIGTERM, or the time limit
// passes, every remaining rank gets SIGTERM, then SIGKILL after `kill_grace`. A failure is
// named after a short wait for its root cause: a user error (exit 2) outranks a failure, a
// failure a SIGPIPE death (the consequences of a peer that has gone). launch_ranks
// returns only after every child has been reaped: no orphans. Plain POSIX; no LibTorch.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hyperparallel::launch {

struct LaunchSpec {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: pick a free port (single node only)
  std::vector<std::string> command;  // argv of every rank
  std::vector<std::pair<std::string, std::string>> extra_env;
  std::chrono::milliseconds kill_grace{10000};
  std::optional<std::chrono::milliseconds> time_limit;  // whole job
  bool prefix_output = true;
};

struct RankOutcome {
  int rank = -1;       // global rank
  int pid = -1;
  bool signaled = false;
  int exit_code = 0;   // when !signaled
  int signal = 0;      // when signaled
  bool stopped_by_launcher = false;  // it got SIGTERM/SIGKILL from us
  bool ok() const { return !signaled && exit_code == 0; }
  std::string describe() const;  // "rank 1 (pid 123) exited with code 3"
};

struct LaunchResult {
  int exit_code = 0;  // 0, the failing rank's exit code, 128+signal, or 124 on time limit
  std::vector<RankOutcome> ranks;
  std::optional<RankOutcome> first_failure;
  int launcher_signal = 0;  // SIGINT/SIGTERM received by the launcher, else 0
  bool timed_out = false;
  std::string summary;  // one line for the user; empty when every rank succeeded
};

// Validates the spec (UserError-style std::invalid_argument with the fix), runs the ranks
// of this node to completion and reports how they ended.
LaunchResult launch_ranks(const LaunchSpec& spec);

}  // namespace hyperparallel::launch
