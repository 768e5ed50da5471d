// Whether LibTorch's bf16 matmul is accurate on this CPU. With AVX-512 (oneDNN's kernels)
// a bf16 matmul multiplies in bf16 and accumulates in fp32. Without it, LibTorch 1.13 falls
// back to its own gemm, which for a non-transposed right-hand side accumulates in bf16: a
// sum of 512 ones stops at 256 (each added 1 rounds away once the sum passes 256), so any
// matmul with an inner dimension in the hundreds loses most of its bits. Measured, not
// guessed from flags: one [1 x 1024] x [1024 x 1] product of ones must give 1024.
#pragma once

namespace hyperparallel::platform {

bool bf16_matmul_accumulates_in_fp32();

}  // namespace hyperparallel::platform
