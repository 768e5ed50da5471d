// Fuzz-target helper: the loaders under test read files, so each input is written to one
// scratch file per process (under $TMPDIR) and its path handed to the loader.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

namespace hyperparallel::fuzz {

inline std::string write_input(const uint8_t* data, size_t size, const std::string& suffix) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/hp_fuzz_" + std::to_string(::getpid()) + suffix;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

}  // namespace hyperparallel::fuzz
