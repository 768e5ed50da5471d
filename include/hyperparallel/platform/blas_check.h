// Which BLAS this process really runs on. Debian's LibTorch links libblas.so.3, which
// resolves through the alternatives system either to OpenBLAS (~24 ms for a 1024^3 fp32
// matmul) or to the reference Netlib BLAS (~440 ms). The check reads the loaded shared
// objects of this process (dl_iterate_phdr), so it reports what the dynamic linker chose,
// not what a config file claims.
#pragma once

#include <string>

namespace hyperparallel::platform {

struct BlasInfo {
  std::string path;            // resolved path of the loaded libblas.so.3 ("" if none loaded)
  bool is_reference = false;   // true when it is the slow reference implementation
};

BlasInfo loaded_blas();

// Returns a multi-line warning when the reference BLAS is loaded, else "".
std::string reference_blas_warning();

}  // namespace hyperparallel::platform
