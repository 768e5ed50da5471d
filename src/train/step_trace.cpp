#include "step_trace.h"

#include <algorithm>
#include <filesystem>

#include "hyperparallel/comm/job_trace.h"
#include "io/atomic_write.h"

namespace hyperparallel::train {

StepTrace::StepTrace(int64_t trace_steps, int64_t total_steps, std::vector<fsdp::FSDPModule> units,
                     std::vector<std::shared_ptr<comm::Communicator>> comms)
    : first_traced_(total_steps - std::min(trace_steps, total_steps)), units_(std::move(units)), comms_(std::move(comms)) {
  if (trace_steps > 0) trace_ = std::make_shared<platform::TraceRecorder>();
}

void StepTrace::step_starting(int64_t step) {
  if (!trace_ || attached_ || step < first_traced_) return;
  attached_ = true;  // a resumed run may start past first_traced_
  for (auto& unit : units_) unit.set_trace(trace_);
  for (const auto& comm : comms_) comm->set_trace(trace_);
}

void StepTrace::step_done(int64_t step, Clock::time_point started) {
  if (trace_ && step >= first_traced_) trace_->span("step " + std::to_string(step + 1), "step", started, Clock::now());
}

void StepTrace::write(comm::Communicator& world, const std::string& output_dir) {
  if (!trace_) return;
  for (auto& unit : units_) unit.set_trace(nullptr);
  for (const auto& comm : comms_) comm->set_trace(nullptr);
  const std::string document = comm::gather_job_trace(world, *trace_);
  if (world.rank() == 0) io::write_file_atomically((std::filesystem::path(output_dir) / "trace.json").string(), document);
}

}  // namespace hyperparallel::train
