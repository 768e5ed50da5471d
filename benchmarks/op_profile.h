// Where a step's time goes, by operator: runs a callable under LibTorch's (legacy, CPU)
// autograd profiler and prints each ATen op's self time (its time minus the ops it called),
// call count and share of the step, largest first. Self time is the honest split: the
// inclusive time of `aten::linear` also holds the `aten::addmm` inside it. Backward runs on
// the calling thread for CPU tensors, so one thread-local profile sees the whole step.
// Header-only: benchmark binaries include it, the library does not.
#pragma once

#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace hyperparallel::benchmarks {

struct OpTime {
  double self_us = 0;
  int64_t calls = 0;
};

// Self time per op name from one thread's push/pop ranges.
inline void accumulate_self_times(const std::vector<torch::autograd::profiler::LegacyEvent>& events,
                                  std::map<std::string, OpTime>& out) {
  using torch::autograd::profiler::EventKind;
  struct Open {
    const torch::autograd::profiler::LegacyEvent* push;
    double children_us;
  };
  std::vector<Open> stack;
  for (const auto& e : events) {
    if (e.kind() == EventKind::PushRange) {
      stack.push_back({&e, 0});
    } else if (e.kind() == EventKind::PopRange && !stack.empty()) {
      const Open open = stack.back();
      stack.pop_back();
      const double total = open.push->cpuElapsedUs(e);
      OpTime& t = out[open.push->name()];
      t.self_us += total - open.children_us;
      t.calls += 1;
      if (!stack.empty()) stack.back().children_us += total;
    }
  }
}

// Runs `step` once under the profiler and prints the `top` ops by self time.
template <typename Step>
void print_op_profile(const char* title, Step&& step, size_t top = 25) {
  using namespace torch::autograd::profiler;
  std::map<std::string, OpTime> ops;
  const auto start = std::chrono::steady_clock::now();
  {
    TLSLegacyProfilerGuard guard(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU),
                                 [&](const thread_event_lists& lists) {
                                   for (const auto& list : lists) accumulate_self_times(list, ops);
                                 });
    step();
  }
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::vector<std::pair<std::string, OpTime>> sorted(ops.begin(), ops.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.self_us > b.second.self_us; });
  std::printf("profile: %s, one step %.1f ms (profiled)\n%-44s %10s %7s %7s\n", title, wall_ms, "op", "self_ms", "calls", "share");
  for (size_t i = 0; i < std::min(top, sorted.size()); ++i) {
    const OpTime& t = sorted[i].second;
    std::printf("%-44s %10.1f %7ld %6.1f%%\n", sorted[i].first.c_str(), t.self_us / 1e3, static_cast<long>(t.calls),
                100.0 * t.self_us / 1e3 / wall_ms);
  }
}

}  // namespace hyperparallel::benchmarks
