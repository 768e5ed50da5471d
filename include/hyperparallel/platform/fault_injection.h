// FaultInjector: makes one rank fail at a chosen moment, to test that a job survives it.
//
// A spec "RANK:POINT:N[:ACTION]", e.g. "1:reduce_scatter:3:kill", makes world rank RANK fail
// the Nth time it passes POINT (counted per process, from 1). Points:
//   - every collective as it is issued, named by its kind: all_gather, reduce_scatter,
//     all_reduce, broadcast, all_to_all, send, recv, barrier. FSDP all-gathers in forward and
//     reduce-scatters in backward, so these also aim inside forward and inside backward;
//   - checkpoint_file_written: this rank's checkpoint file is on disk, the state file that
//     completes the checkpoint is not (the middle of a save).
// Actions: kill (SIGKILL itself, the default), exit (exit code 3 at once, no cleanup), throw
// (a std::runtime_error that unwinds through whatever passed the point), kill_job (SIGKILL
// the launcher that started this rank; its ranks die with it by PR_SET_PDEATHSIG: kill -9 of
// the whole job).
// Not a global: `hyperparallel train` builds one from the HP_FAULT_INJECT environment variable
// and hands it to the world's CommOptions, where the communicator and the checkpoint writer
// find it. Tests use it; a production run has none (docs/reliability.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace hyperparallel::platform {

class FaultInjector {
 public:
  enum class Action { kKill, kExit, kThrow, kKillJob };

  // Throws UserError naming the spec and the expected form when it is malformed.
  explicit FaultInjector(const std::string& spec);

  // Counts a pass of `point` on `world_rank`; fails as specified at the chosen pass.
  void pass(const std::string& point, int world_rank);

 private:
  int rank_ = 0;
  std::string point_;
  int64_t nth_ = 1;
  Action action_ = Action::kKill;
  std::atomic<int64_t> passes_{0};
};

}  // namespace hyperparallel::platform
