// What every benchmark program measures the same way: peak and current RSS, medians.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

namespace hyperparallel::benchmarks {

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

}  // namespace hyperparallel::benchmarks
