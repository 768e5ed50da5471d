// Helpers that let any dtype cross Gloo: tensors travel as flat uint8 views of their own
// storage (no copy), and reductions Gloo cannot do natively run locally, in rank order,
// in an accumulation dtype (fp32 for bf16/fp16) with a single cast at the end.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "hyperparallel/comm/communicator.h"

namespace hyperparallel::comm {

// A 1-D uint8 view of a contiguous tensor's elements (same storage, no copy).
at::Tensor flat_bytes(const at::Tensor& t);

// dtypes whose all-reduce we hand to Gloo (the rest reduce locally: docs/comm.md).
bool gloo_reduces_natively(at::ScalarType dtype);

// The dtype a reduction of `dtype` accumulates in (fp32 for half types).
at::ScalarType accumulation_dtype(at::ScalarType dtype);

// Throws UserError when `op` does not apply to `dtype` (avg of integers, sum of bools).
void check_reducible(at::ScalarType dtype, ReduceOp op, const std::string& what);

// Throws UserError unless `t` is defined, on the CPU and contiguous.
void check_transportable(const at::Tensor& t, const std::string& what, const std::string& role);

// out = op over i of rows[i] for i = 0..rows.size(0)-1 in that order, accumulated in
// accumulation_dtype and cast once into out. rows: [N, n]; out: n elements.
void reduce_rows_in_rank_order(const at::Tensor& rows, ReduceOp op, const at::Tensor& out);

}  // namespace hyperparallel::comm
