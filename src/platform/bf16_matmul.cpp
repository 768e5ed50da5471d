// See platform/bf16_matmul.h.
#include "hyperparallel/platform/bf16_matmul.h"

#include <ATen/ATen.h>

namespace hyperparallel::platform {

bool bf16_matmul_accumulates_in_fp32() {
  const at::Tensor a = at::ones({16, 1024}, at::kBFloat16), b = at::ones({1024, 16}, at::kBFloat16);
  return at::mm(a, b).to(at::kFloat).min().item<float>() == 1024.0f;
}

}  // namespace hyperparallel::platform
