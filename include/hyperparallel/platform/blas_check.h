// Which BLAS this process really runs on. The PyPI wheel's LibTorch (scripts/setup.sh) carries
// MKL inside libtorch_cpu, threaded on ATen's own OpenMP pool. A LibTorch built against the
// system BLAS (a user's own, or a distribution's) links libblas.so.3, which on Debian resolves
// through the alternatives system either to OpenBLAS (~24 ms for a 1024^3 fp32 matmul) or to the
// reference Netlib BLAS (~440 ms). The check reads the loaded shared objects of this process
// (dl_iterate_phdr), so it reports what the dynamic linker chose, not what a config file
// claims. OpenBLAS picks one kernel set per process when it loads, from the CPU or from
// OPENBLAS_CORETYPE, so benchmarks record `kernels` with their numbers.
//
// The thread count follows from it. Without OMP_NUM_THREADS a process gets one intra-op thread
// per online CPU when the BLAS shares LibTorch's OpenMP pool (MKL in the wheel; OpenBLAS's
// OpenMP build): every GEMM, softmax, norm and elementwise kernel then uses every core. Beside a
// BLAS with a pool of its own (OpenBLAS's pthread build) more OpenMP threads only compete with
// it (the 48 M model step measured 9.6 s with 2 + 2 threads against 8.6 s at 1 thread on
// LibTorch 1.13 + OpenBLAS; docs/benchmarks.md, "Models").
#pragma once

#include <string>

namespace hyperparallel::platform {

struct BlasInfo {
  std::string library;         // "mkl" (inside libtorch_cpu), "openblas", "libblas" (other), "" (none found)
  std::string path;            // resolved path of the loaded libblas.so.3 ("" if none loaded)
  bool is_reference = false;   // true when it is the slow reference implementation
  bool uses_openmp = false;    // MKL or OpenBLAS's OpenMP build: its GEMMs run on LibTorch's threads
  std::string kernels;         // OpenBLAS's kernel set ("Haswell", "SkylakeX", ...); "mkl/" + ATen's CPU capability
};

BlasInfo loaded_blas();

// Returns a multi-line warning when the reference BLAS is loaded, else "".
std::string reference_blas_warning();

// Unless OMP_NUM_THREADS says otherwise (the launcher sets each rank's share), gives
// LibTorch's intra-op pool one thread per online CPU when the BLAS shares that pool; leaves
// it alone beside a BLAS with a pool of its own. Returns the intra-op thread count.
int configure_compute_threads();

}  // namespace hyperparallel::platform
