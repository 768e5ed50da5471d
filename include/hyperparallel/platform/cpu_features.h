// What this CPU computes fast, for choices such as `bf16: auto`. Reads the kernel's flag list
// (/proc/cpuinfo), the same source `lscpu` uses, so it reports the machine, not a build.
// bf16 is "fast" with AVX512_BF16 (dot-product instructions oneDNN uses for bf16 matmul, ~2.3x
// fp32 on the development machines) or AMX-BF16; without either, bf16 matmuls are emulated
// by conversion and are slower than fp32.
#pragma once

#include <string>

namespace hyperparallel::platform {

struct CpuFeatures {
  std::string model_name;    // "model name" of the first processor
  bool avx512_bf16 = false;
  bool amx_bf16 = false;
  bool fast_bf16() const { return avx512_bf16 || amx_bf16; }
};

// Parses a /proc/cpuinfo text (the first processor's entry).
CpuFeatures parse_cpuinfo(const std::string& text);
// This machine's; all false when /proc/cpuinfo cannot be read.
CpuFeatures cpu_features();

}  // namespace hyperparallel::platform
