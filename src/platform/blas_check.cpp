#include "hyperparallel/platform/blas_check.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>

namespace hyperparallel::platform {
namespace {

struct LoadedObjects {
  std::string blas;             // resolved path of libblas.so.3
  bool pthread_openblas = false;  // some loaded object is OpenBLAS's pthread build
};

std::string resolved(const std::string& name) {
  char buffer[PATH_MAX];
  return realpath(name.c_str(), buffer) ? std::string(buffer) : name;
}

// Resolves every loaded object once: libblas.so.3's path, and whether any object (libblas,
// liblapack or libopenblas through its own alternative) is OpenBLAS's pthread build.
int collect_objects(struct dl_phdr_info* info, size_t, void* data) {
  auto* found = static_cast<LoadedObjects*>(data);
  const std::string name = info->dlpi_name ? info->dlpi_name : "";
  if (name.empty()) return 0;
  const std::string path = resolved(name);
  if (name.find("libblas.so") != std::string::npos) found->blas = path;
  if (path.find("openblas-pthread") != std::string::npos) found->pthread_openblas = true;
  return 0;
}

}  // namespace

BlasInfo loaded_blas() {
  LoadedObjects loaded;
  dl_iterate_phdr(collect_objects, &loaded);
  BlasInfo info;
  if (loaded.blas.empty() && at::hasMKL()) {
    // The PyPI wheel's LibTorch: MKL linked into libtorch_cpu, threaded by the same OpenMP
    // runtime as ATen (MKL's GNU threading layer), so its GEMMs run on LibTorch's pool. MKL
    // picks its kernels from the CPU; ATen's own vector kernels run at get_cpu_capability().
    info.library = "mkl";
    info.uses_openmp = at::hasOpenMP();
    info.kernels = "mkl/" + at::get_cpu_capability();
    return info;
  }
  info.path = loaded.blas;
  info.library = info.path.empty() ? "" : info.path.find("openblas") != std::string::npos ? "openblas" : "libblas";
  // OpenBLAS, BLIS and MKL all ship a libblas.so.3 under their own directory; the
  // reference implementation lives in .../blas/ (Debian's libblas3 package).
  info.is_reference = !info.path.empty() && info.path.find("openblas") == std::string::npos &&
                      info.path.find("blis") == std::string::npos &&
                      info.path.find("mkl") == std::string::npos;
  // Each of libblas, liblapack and libopenblas has an alternative of its own: one left on the
  // pthread build brings that build's thread pool into the process beside the OpenMP one.
  info.uses_openmp = info.path.find("openblas-openmp") != std::string::npos && !loaded.pthread_openblas;
  // Looked up, not linked: the reference BLAS has no such function.
  using CoreName = const char* (*)();
  if (auto corename = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"))) info.kernels = corename();
  return info;
}

std::string reference_blas_warning() {
  const BlasInfo info = loaded_blas();
  if (!info.is_reference) return "";
  return "WARNING: libblas.so.3 resolves to the reference BLAS (" + info.path +
         ");\nWARNING: matrix multiplies run ~20x slower than with MKL or OpenBLAS.\n"
         "WARNING: fix: build against the torch wheel of scripts/setup.sh (MKL inside), or select OpenBLAS:\n"
         "WARNING:      apt-get install libopenblas0-openmp && update-alternatives --set libblas.so.3-x86_64-linux-gnu "
         "/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3\n";
}

int configure_compute_threads() {
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (!std::getenv("OMP_NUM_THREADS") && cpus > at::get_num_threads() && loaded_blas().uses_openmp) {
    at::set_num_threads(static_cast<int>(cpus));
  }
  return at::get_num_threads();
}

}  // namespace hyperparallel::platform
