// Data preparation of a training config (train/train_data.h), one mode per process so the
// resident growth is this mode's alone (scripts/bench_data.sh interleaves the modes):
//   data_bench CONFIG.yaml [key=value ...]
// The keys choose the mode (tokenized_cache_dir, preprocessing_num_workers). Prints one
// RESULT line: seconds of prepare_train_data, the rows and tokens made, and the resident
// growth of the process holding them (in memory, or mapped pages of the cache file, which
// the ranks of a machine share).
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "hyperparallel/train/train_config.h"
#include "train/tokenized_cache.h"
#include "train/train_data.h"

namespace hp = hyperparallel;

namespace {

double resident_mib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

struct Sample {
  double seconds = 0, resident_mib = 0;
  int64_t rows = 0, tokens = 0;
};

Sample prepare(const std::string& yaml, std::vector<std::string> overrides) {
  const hp::train::TrainConfig config = hp::train::load_train_config(yaml, overrides);
  const double before = resident_mib();
  const auto t = std::chrono::steady_clock::now();
  const hp::train::TrainData data = hp::train::prepare_train_data(config);
  Sample s;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  for (int64_t i = 0; i < data.rows.size(); ++i) s.tokens += data.rows.length(i);  // touches every row, as training does
  s.resident_mib = resident_mib() - before;
  s.rows = data.rows.size();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: data_bench CONFIG.yaml [key=value ...]\n");
    return 2;
  }
  at::set_num_threads(1);
  std::vector<std::string> overrides;
  for (int i = 2; i < argc; ++i) overrides.emplace_back(argv[i]);
  const Sample s = prepare(argv[1], overrides);
  std::printf("RESULT seconds=%.3f rows=%lld tokens=%lld resident_growth_mib=%.1f threads=%d\n", s.seconds,
              static_cast<long long>(s.rows), static_cast<long long>(s.tokens), s.resident_mib,
              hp::train::tokenizing_threads(hp::train::load_train_config(argv[1], overrides).preprocessing_num_workers));
  return 0;
}
