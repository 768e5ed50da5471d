// bf16 GEMMs through fp32 where this CPU has no bf16 dot-product instructions.
//
// LibTorch's bf16 matmul reaches oneDNN's fast kernels on CPUs with AVX512_BF16 or AMX-BF16;
// elsewhere (AVX2-only machines) LibTorch 2.11 converts element by element inside its own
// GEMM and runs 4-30x slower than fp32 on the same product (measured on an AMD EPYC: a
// [256 x 512] x [512 x 151936] head product 9.4 s in bf16 against 1.5 s in fp32), so a bf16
// step took minutes. There the products of bf16 operands here convert the operands to fp32,
// run the fp32 GEMM and round the result to bf16: what a bf16 GEMM with fp32 accumulation
// computes (exact products of bf16 values, fp32 sums, one rounding of the output), at fp32's
// speed plus the conversions. Everything else stays bf16: parameters, activations, what
// autograd saves (the linear saves its bf16 inputs and converts them again in backward).
// The choice is the machine's (platform/cpu_features.h), read once per process.
#pragma once

#include <ATen/core/Tensor.h>

namespace hyperparallel::models {

// True on a CPU without AVX512_BF16 or AMX-BF16.
bool bf16_gemms_through_fp32();

// Whether a product of these operands goes through the fp32 GEMM here: both bf16 CPU
// tensors and bf16_gemms_through_fp32().
bool gemm_through_fp32(const at::Tensor& a, const at::Tensor& b);

// a [m, k] x b [k, n]; bf16 x bf16 through the fp32 GEMM where bf16_gemms_through_fp32().
at::Tensor gemm(const at::Tensor& a, const at::Tensor& b);

// y = x Wᵀ + b as at::linear, with autograd; bf16 products through fp32 where
// bf16_gemms_through_fp32(). `bias` may be undefined.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// The routed form itself, whatever the CPU (tests compare it with LibTorch's bf16 linear).
at::Tensor linear_through_fp32_gemm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace hyperparallel::models
