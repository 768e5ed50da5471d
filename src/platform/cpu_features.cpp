#include "hyperparallel/platform/cpu_features.h"

#include <fstream>
#include <sstream>

namespace hyperparallel::platform {

CpuFeatures parse_cpuinfo(const std::string& text) {
  CpuFeatures f;
  std::istringstream in(text);
  bool seen_flags = false, seen_model = false;
  for (std::string line; std::getline(in, line) && !(seen_flags && seen_model);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && !seen_model) {
      f.model_name = value;
      seen_model = true;
    } else if (key == "flags" && !seen_flags) {
      std::istringstream flags(value);
      for (std::string flag; flags >> flag;) {
        f.avx512_bf16 |= flag == "avx512_bf16";
        f.amx_bf16 |= flag == "amx_bf16";
      }
      seen_flags = true;
    }
  }
  return f;
}

CpuFeatures cpu_features() {
  std::ifstream in("/proc/cpuinfo");
  std::stringstream text;
  text << in.rdbuf();
  return parse_cpuinfo(text.str());
}

}  // namespace hyperparallel::platform
