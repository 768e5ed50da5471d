#include "hyperparallel/platform/blas_check.h"

#include <link.h>
#include <climits>
#include <cstdlib>

namespace hyperparallel::platform {
namespace {

int collect_blas(struct dl_phdr_info* info, size_t, void* data) {
  auto* found = static_cast<std::string*>(data);
  const std::string name = info->dlpi_name ? info->dlpi_name : "";
  if (name.find("libblas.so") != std::string::npos) {
    char resolved[PATH_MAX];
    *found = realpath(name.c_str(), resolved) ? std::string(resolved) : name;
    return 1;
  }
  return 0;
}

}  // namespace

BlasInfo loaded_blas() {
  BlasInfo info;
  dl_iterate_phdr(collect_blas, &info.path);
  // OpenBLAS, BLIS and MKL all ship a libblas.so.3 under their own directory; the
  // reference implementation lives in .../blas/ (Debian's libblas3 package).
  info.is_reference = !info.path.empty() && info.path.find("openblas") == std::string::npos &&
                      info.path.find("blis") == std::string::npos &&
                      info.path.find("mkl") == std::string::npos;
  return info;
}

std::string reference_blas_warning() {
  const BlasInfo info = loaded_blas();
  if (!info.is_reference) return "";
  return "WARNING: libblas.so.3 resolves to the reference BLAS (" + info.path +
         ");\nWARNING: matrix multiplies run ~20x slower than with OpenBLAS.\n"
         "WARNING: fix: run scripts/setup.sh as root (installs libopenblas0-pthread), or\n"
         "WARNING:      update-alternatives --auto libblas.so.3-x86_64-linux-gnu\n";
}

}  // namespace hyperparallel::platform
