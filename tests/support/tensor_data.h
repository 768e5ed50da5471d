// Deterministic per-rank test data: any rank can regenerate any other rank's input, so a
// test computes the exact expected result of a collective locally.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace hyperparallel::testing {

// Random values of `dtype` that depend only on (seed, rank). Integer dtypes get small
// integers; `integral_floats` makes float values small integers too (exact in any order).
inline at::Tensor rank_data(int64_t seed, int rank, at::IntArrayRef shape, at::ScalarType dtype,
                            bool integral_floats = false) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed * 1000 + rank));
  if (!at::isFloatingType(dtype) || integral_floats) {
    if (dtype == at::kBool) return at::randint(0, 2, shape, gen, at::TensorOptions().dtype(at::kLong)).to(at::kBool);
    return at::randint(-50, 50, shape, gen, at::TensorOptions().dtype(at::kLong)).to(dtype);
  }
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
}

}  // namespace hyperparallel::testing
