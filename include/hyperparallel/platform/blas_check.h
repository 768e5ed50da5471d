// Which BLAS this process really runs on. Debian's LibTorch links libblas.so.3, which
// resolves through the alternatives system either to OpenBLAS (~24 ms for a 1024^3 fp32
// matmul) or to the reference Netlib BLAS (~440 ms). The check reads the loaded shared
// objects of this process (dl_iterate_phdr), so it reports what the dynamic linker chose,
// not what a config file claims. OpenBLAS picks one kernel set per process when it loads, from
// the CPU or from OPENBLAS_CORETYPE: on an AVX-512 CPU OPENBLAS_CORETYPE=Haswell holds it to its
// AVX2 kernels (on a 2-core AMD EPYC with AVX512_BF16: 255 vs 423 GFLOP/s for the model
// benchmark's fp32 GEMMs), so benchmarks record `kernels` with their numbers.
//
// The thread count follows from it. LibTorch 1.13 takes its default intra-op thread count
// from cpuinfo's core count, which reads 1 on the 2-core machines here, so without
// OMP_NUM_THREADS every softmax, norm and elementwise kernel runs on one core. More threads
// help only when OpenBLAS shares LibTorch's OpenMP pool (Debian's libopenblas0-openmp, which
// scripts/setup.sh selects): the pthread build keeps its own pool spinning beside OpenMP's,
// and the 48 M model step measured 9.6 s with 2 + 2 threads against 8.6 s with OpenMP at 1
// thread; on the shared pool with 2 threads it took 7.0 s against 7.7 s (interleaved in one
// run; docs/benchmarks.md, "Models").
#pragma once

#include <string>

namespace hyperparallel::platform {

struct BlasInfo {
  std::string path;            // resolved path of the loaded libblas.so.3 ("" if none loaded)
  bool is_reference = false;   // true when it is the slow reference implementation
  bool uses_openmp = false;    // OpenBLAS's OpenMP build: its GEMMs run on LibTorch's threads
  std::string kernels;         // OpenBLAS's kernel set ("Haswell", "SkylakeX", ...); "" if not OpenBLAS
};

BlasInfo loaded_blas();

// Returns a multi-line warning when the reference BLAS is loaded, else "".
std::string reference_blas_warning();

// Unless OMP_NUM_THREADS says otherwise (the launcher sets each rank's share), gives
// LibTorch's intra-op pool one thread per online CPU when the BLAS shares that pool; leaves
// it alone beside a BLAS with a pool of its own. Returns the intra-op thread count.
int configure_compute_threads();

}  // namespace hyperparallel::platform
