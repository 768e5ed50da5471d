// Fields of /proc/self/status for tests that measure this process's memory (VmRSS, VmHWM,
// RssFile: the resident pages of mapped files).
#pragma once

#include <fstream>
#include <string>

namespace hyperparallel::testing {

// `field` ("VmRSS", "VmHWM", ...) in MiB; 0 when the kernel does not report it.
inline double process_status_mb(const std::string& field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  }
  return 0;
}

}  // namespace hyperparallel::testing
