// Whether LibTorch's bf16 matmul is accurate on this CPU. With AVX-512 (oneDNN's kernels)
// a bf16 matmul multiplies in bf16 and accumulates in fp32. Without it, LibTorch 1.13 fell
// back to its own gemm, which for a non-transposed right-hand side accumulates in bf16: a
// sum of 512 ones stops at 256 (each added 1 rounds away once the sum passes 256), so any
// matmul with an inner dimension in the hundreds loses most of its bits. Measured, not
// guessed from flags: one [16 x 1024] x [1024 x 16] product of ones must give 1024. The shape
// matters: LibTorch sends a product to oneDNN only when m x k x n exceeds 16^3, so a
// [1 x 1024] x [1024 x 1] probe takes the native gemm and reads 256 even on an AVX-512 CPU
// (measured on a Xeon with AVX512_BF16 and AMX, where every model-sized product is accurate).
// Products at or below that size still accumulate in bf16; a model's matmuls are far above it.
// LibTorch 2.11 (the PyPI wheel) accumulates in fp32 on AVX2-only CPUs too: both probe shapes
// give 1024 on an AMD EPYC without AVX-512. The probe stays for a LibTorch of the user's own.
#pragma once

namespace hyperparallel::platform {

bool bf16_matmul_accumulates_in_fp32();

}  // namespace hyperparallel::platform
