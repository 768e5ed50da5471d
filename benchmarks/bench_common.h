// What every benchmark program measures the same way: peak and current RSS, medians, the
// steps of a multi-rank training loop (time, exposed communication, bytes), and one Chrome
// trace of all ranks.
#pragma once

#include <ATen/ATen.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/comm/job_trace.h"
#include "hyperparallel/platform/host_allocator.h"
#include "hyperparallel/platform/trace.h"

namespace hyperparallel::benchmarks {

// The caching host allocator the trainer installs, with this rank's share of the machine
// (LOCAL_WORLD_SIZE processes, as our launcher and torchrun set it).
inline void install_host_cache() {
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  const int ranks = local ? std::max(1, std::atoi(local)) : 1;
  platform::CachingHostAllocator::install(platform::CachingHostAllocator::default_limit(ranks));
}

// Rank 0 gathers every rank's events and writes one Chrome trace (pid = rank).
inline void write_trace(comm::Communicator& world, const platform::TraceRecorder& trace, const std::string& path) {
  const std::string document = comm::gather_job_trace(world, trace);
  if (world.rank() != 0) return;
  std::ofstream out(path);
  out << document;
  if (!out) throw std::runtime_error("cannot write the trace to " + path);
}

// This process's peak RSS (ru_maxrss) in MiB.
inline double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

// A field of /proc/self/status (VmRSS, VmHWM, ...) in MiB; -1 when absent.
inline double status_mb(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  }
  return -1;
}

// The median of durations in seconds, in milliseconds.
inline double median_ms(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2] * 1e3;
}

// Runs steps 0..steps of a training loop, step 0 a warm-up (allocator, groups) that is not
// counted; each step starts after a barrier. Measures each step's time, the time blocked in
// wait() on the job's groups (a group named twice counted once) and the bytes they sent.
class StepMeter {
 public:
  explicit StepMeter(const std::vector<std::shared_ptr<comm::Communicator>>& groups) {
    std::set<comm::Communicator*> seen;
    for (const auto& g : groups) {
      if (seen.insert(g.get()).second) groups_.push_back(g);
    }
  }

  template <typename Step>
  void run(comm::Communicator& world, int steps, Step&& step) {
    for (int s = 0; s <= steps; ++s) {
      world.barrier().wait();
      const double wait_before = waited();
      const int64_t bytes_before = bytes(false), all_to_all_before = bytes(true);
      const auto t0 = std::chrono::steady_clock::now();
      step(s);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s == 0) continue;
      times_.push_back(dt);
      total_ += dt;
      exposed_ += waited() - wait_before;
      bytes_ += bytes(false) - bytes_before;
      all_to_all_ += bytes(true) - all_to_all_before;
    }
  }

  double median_step_ms() const { return median_ms(times_); }
  double exposed_share() const { return exposed_ / total_; }
  double mb_per_step() const { return static_cast<double>(bytes_) / static_cast<double>(times_.size()) / 1e6; }
  double all_to_all_mb_per_step() const { return static_cast<double>(all_to_all_) / static_cast<double>(times_.size()) / 1e6; }

 private:
  double waited() const {
    double s = 0;
    for (const auto& g : groups_) s += g->wait_seconds();
    return s;
  }
  int64_t bytes(bool all_to_all_only) const {
    int64_t b = 0;
    for (const auto& g : groups_) {
      b += all_to_all_only ? g->counters()[comm::CollectiveKind::kAllToAll].bytes : g->counters().total_bytes();
    }
    return b;
  }

  std::vector<std::shared_ptr<comm::Communicator>> groups_;
  std::vector<double> times_;
  double total_ = 0, exposed_ = 0;
  int64_t bytes_ = 0, all_to_all_ = 0;
};

}  // namespace hyperparallel::benchmarks
