// Runs a command to completion (or until a limit) and captures its merged output, exit
// code and duration; for tests of the command-line tool. Optionally sends a signal to it
// after a delay.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hyperparallel::testing {

struct SubprocessResult {
  int exit_code = -1;  // 128 + signal when killed by a signal
  std::string output;  // stdout and stderr, interleaved
  double seconds = 0;
};

struct SubprocessOptions {
  SubprocessOptions(std::chrono::seconds limit = std::chrono::seconds(60),
                    std::vector<std::pair<std::string, std::string>> env = {})
      : limit(limit), env(std::move(env)) {}

  std::chrono::seconds limit;
  // Send `signal` once the output holds `count` occurrences of `text` (e.g. every rank's
  // "ready" line), so the signal cannot arrive before the program is up.
  struct SignalWhen {
    std::string text;
    int count = 1;
    int signal = 0;
    // Also signal, at the same moment, every process whose command line holds this text
    // (a launcher's ranks live in their own process groups): "kill -9 the whole job".
    std::string also_processes_with;
  };
  std::optional<SignalWhen> signal_when;
  std::vector<std::pair<std::string, std::string>> env;
  std::vector<std::string> unset_env;
  std::string working_dir;  // "" = the test's own
};

SubprocessResult run_subprocess(const std::vector<std::string>& argv, const SubprocessOptions& options = {});

// The `hyperparallel` tool of the build this test binary belongs to (<build>/hyperparallel, next
// to <build>/tests/hp_tests), found at run time: HP_CLI_PATH names it in the tests, and the
// test objects do not depend on the build folder.
const char* cli_path();

// Processes whose command line contains `marker` (scans /proc).
std::vector<int> processes_with(const std::string& marker);

}  // namespace hyperparallel::testing
