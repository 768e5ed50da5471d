#include "byte_transport.h"

#include <ATen/ATen.h>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::comm {

at::Tensor flat_bytes(const at::Tensor& t) {
  at::Tensor flat = t.view({-1});
  return flat.scalar_type() == at::kByte ? flat : flat.view(at::kByte);
}

bool gloo_reduces_natively(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
    case at::kDouble:
    case at::kInt:
    case at::kLong:
    case at::kByte:
    case at::kChar:
      return true;
    default:
      return false;
  }
}

at::ScalarType accumulation_dtype(at::ScalarType dtype) {
  if (dtype == at::kHalf || dtype == at::kBFloat16) return at::kFloat;
  return dtype;
}

void check_reducible(at::ScalarType dtype, ReduceOp op, const std::string& what) {
  if (op == ReduceOp::kAvg && !at::isFloatingType(dtype)) {
    throw UserError(what + ": avg needs a floating-point tensor, got " +
                    std::string(c10::toString(dtype)) + "; use sum and divide yourself");
  }
  if (dtype == at::kBool && (op == ReduceOp::kSum || op == ReduceOp::kAvg)) {
    throw UserError(what + ": bool tensors reduce with max (logical or) or min (logical and), not " +
                    std::string(to_string(op)));
  }
  if (at::isComplexType(dtype)) {
    throw UserError(what + ": complex dtypes are not supported");
  }
}

void check_transportable(const at::Tensor& t, const std::string& what, const std::string& role) {
  if (!t.defined()) throw UserError(what + ": " + role + " tensor is undefined");
  if (!t.device().is_cpu()) {
    throw UserError(what + ": " + role + " tensor is on " + t.device().str() +
                    "; the Gloo communicator takes CPU tensors");
  }
  if (!t.is_contiguous()) {
    throw UserError(what + ": " + role + " tensor must be contiguous; call .contiguous() first");
  }
}

void reduce_rows_in_rank_order(const at::Tensor& rows, ReduceOp op, const at::Tensor& out) {
  const int64_t n = rows.size(0);
  const at::ScalarType acc_type = accumulation_dtype(rows.scalar_type());
  // Accumulate in place in `out` when it has the accumulation dtype (no temporary: fresh
  // memory is expensive here, see scratch_pool.h); half types go through an fp32 buffer.
  const bool in_place = acc_type == out.scalar_type() && out.is_contiguous();
  at::Tensor acc = in_place ? out.view({-1}) : at::empty({rows.size(1)}, rows.options().dtype(acc_type));
  acc.copy_(rows[0]);
  for (int64_t i = 1; i < n; ++i) {
    at::Tensor row = rows[i];
    if (row.scalar_type() != acc_type) row = row.to(acc_type);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc.add_(row);
        break;
      case ReduceOp::kMax:
        at::maximum_out(acc, acc, row);
        break;
      case ReduceOp::kMin:
        at::minimum_out(acc, acc, row);
        break;
    }
  }
  if (op == ReduceOp::kAvg) acc.div_(static_cast<double>(n));
  if (!in_place) out.view({-1}).copy_(acc);
}

}  // namespace hyperparallel::comm
