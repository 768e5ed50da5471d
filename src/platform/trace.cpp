#include "hyperparallel/platform/trace.h"

#include <sstream>

namespace hyperparallel::platform {
namespace {

std::string escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out;
}

int64_t micros(TraceRecorder::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

}  // namespace

void TraceRecorder::span(std::string name, const char* category, Clock::time_point start, Clock::time_point end) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({std::move(name), category, micros(start), micros(end) - micros(start)});
}

size_t TraceRecorder::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

std::string TraceRecorder::json_events(int pid) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream out;
  for (size_t i = 0; i < events_.size(); ++i) {
    const Event& e = events_[i];
    // One row per category: compute, communication in flight, time blocked waiting.
    const std::string category = e.category;
    const int tid = category == "compute" ? 0 : category == "comm" ? 1 : 2;
    out << (i ? ",\n" : "") << "{\"name\":\"" << escaped(e.name) << "\",\"cat\":\"" << e.category
        << "\",\"ph\":\"X\",\"ts\":" << e.start_us << ",\"dur\":" << e.duration_us << ",\"pid\":" << pid
        << ",\"tid\":" << tid << "}";
  }
  return out.str();
}

}  // namespace hyperparallel::platform
