// StepTrace: the trainer's `trace_steps`, a Chrome trace (chrome://tracing, Perfetto) of the
// run's last N optimizer steps on every rank, written by rank 0 to output_dir/trace.json: each
// FSDP unit's forward and backward, every collective of the step's groups from issue to
// completion, the time each rank blocked waiting for one, and each step. One process row per
// rank, on one clock, so a wait can be read against what the peers were doing then (docs/
// training.md "Where a step's time goes"). With N = 0 nothing is attached or recorded.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/platform/trace.h"

namespace hyperparallel::train {

class StepTrace {
 public:
  using Clock = platform::TraceRecorder::Clock;

  StepTrace(int64_t trace_steps, int64_t total_steps, std::vector<fsdp::FSDPModule> units,
            std::vector<std::shared_ptr<comm::Communicator>> comms);
  // Attaches the recorder before the first traced step.
  void step_starting(int64_t step);
  // Records the step's own span ("step N").
  void step_done(int64_t step, Clock::time_point started);
  // Every rank calls it after the last step; rank 0 writes output_dir/trace.json.
  void write(comm::Communicator& world, const std::string& output_dir);

 private:
  int64_t first_traced_;  // total_steps - trace_steps, or total_steps when off
  std::vector<fsdp::FSDPModule> units_;
  std::vector<std::shared_ptr<comm::Communicator>> comms_;
  std::shared_ptr<platform::TraceRecorder> trace_;  // null when off
  bool attached_ = false;
};

}  // namespace hyperparallel::train
