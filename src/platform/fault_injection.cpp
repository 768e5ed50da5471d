// Parsing a fault spec and failing at the chosen pass. See fault_injection.h.
#include "hyperparallel/platform/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::platform {
namespace {

const std::vector<std::string> kPoints = {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all",
                                          "send",       "recv",           "barrier",    "checkpoint_file_written"};

[[noreturn]] void bad(const std::string& spec, const std::string& why) {
  throw UserError("HP_FAULT_INJECT '" + spec + "': " + why +
                  "; expected RANK:POINT:N[:kill|exit|throw|kill_job] (docs/reliability.md \"Injected faults\")");
}

int64_t parse_count(const std::string& spec, const std::string& text, const char* what, int64_t min) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || value < min) bad(spec, std::string(what) + " '" + text + "' is not an integer >= " + std::to_string(min));
  return value;
}

}  // namespace

FaultInjector::FaultInjector(const std::string& spec) {
  std::vector<std::string> parts;
  std::stringstream in(spec);
  for (std::string part; std::getline(in, part, ':');) parts.push_back(part);
  if (parts.size() < 3 || parts.size() > 4) bad(spec, "it has " + std::to_string(parts.size()) + " field(s)");
  rank_ = static_cast<int>(parse_count(spec, parts[0], "RANK", 0));
  point_ = parts[1];
  bool known = false;
  std::string list;
  for (const auto& p : kPoints) {
    known |= p == point_;
    list += (list.empty() ? "" : ", ") + p;
  }
  if (!known) bad(spec, "unknown point '" + point_ + "' (points: " + list + ")");
  nth_ = parse_count(spec, parts[2], "N", 1);
  if (parts.size() == 4) {
    const std::string& a = parts[3];
    if (a == "kill") {
      action_ = Action::kKill;
    } else if (a == "exit") {
      action_ = Action::kExit;
    } else if (a == "throw") {
      action_ = Action::kThrow;
    } else if (a == "kill_job") {
      action_ = Action::kKillJob;
    } else {
      bad(spec, "unknown action '" + a + "'");
    }
  }
}

void FaultInjector::pass(const std::string& point, int world_rank) {
  if (world_rank != rank_ || point != point_) return;
  if (++passes_ != nth_) return;
  const std::string what = "injected fault: rank " + std::to_string(rank_) + " at " + point_ + " #" + std::to_string(nth_);
  std::fprintf(stderr, "%s\n", what.c_str());
  std::fflush(stderr);
  switch (action_) {
    case Action::kKill:
      ::kill(::getpid(), SIGKILL);
      break;
    case Action::kExit:
      std::_Exit(3);
    case Action::kThrow:
      throw std::runtime_error(what);
    case Action::kKillJob:
      ::kill(::getppid(), SIGKILL);
      ::kill(::getpid(), SIGKILL);
      break;
  }
}

}  // namespace hyperparallel::platform
