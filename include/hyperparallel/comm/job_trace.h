// One Chrome trace for a whole job: every rank's TraceRecorder events (pid = rank) gathered to
// rank 0 as one JSON document, for chrome://tracing or Perfetto. A collective over `world`:
// every rank calls it. The trainer writes it as output_dir/trace.json (`trace_steps`), the
// benchmarks with `--trace FILE`.
#pragma once

#include <string>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/platform/trace.h"

namespace hyperparallel::comm {

// The document on rank 0 ({"traceEvents":[...]}), "" on the other ranks.
std::string gather_job_trace(Communicator& world, const platform::TraceRecorder& trace);

}  // namespace hyperparallel::comm
