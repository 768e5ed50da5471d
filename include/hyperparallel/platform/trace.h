// TraceRecorder: named time spans of one process, written as Chrome trace events
// (chrome://tracing, Perfetto). Times are steady_clock microseconds, which on Linux is one
// clock for every process of the machine, so ranks' traces line up when merged.
// Thread-safe; attach one to communicators and FSDP units with their set_trace().
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace hyperparallel::platform {

class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // category: "compute", "comm" (issue to completion seen), "wait" (time blocked waiting).
  void span(std::string name, const char* category, Clock::time_point start, Clock::time_point end);
  size_t size() const;
  // The events as comma-separated JSON objects with pid = `pid` (e.g. the rank).
  std::string json_events(int pid) const;

 private:
  struct Event {
    std::string name;
    const char* category;
    int64_t start_us;
    int64_t duration_us;
  };
  mutable std::mutex mutex_;
  std::vector<Event> events_;
};

}  // namespace hyperparallel::platform
