// Rotary embedding fused with the head transpose, as one autograd function.
//
// Input x is [B, T, H, D] with any row stride (e.g. a column slice of the fused QKV
// projection output) and contiguous heads; cos and sin are [B, T, D]. The output is written
// directly in the layout attention's batched GEMM wants, [B, KV, T, G, D] with H = KV * G
// (query head h = kv * G + g, as transformers' repeat_kv pairs them), contiguous: the G
// query heads of one KV head and a range of positions are then one contiguous row block. One pass
// forward, one pass backward, fp32; values equal apply_rope's bit for bit.
#pragma once

#include <ATen/ATen.h>

namespace hyperparallel::models {

// x: [B, T, H, D] fp32 with x.stride(3) == 1 and x.stride(2) == D. Returns [B, kv_heads, T,
// H / kv_heads, D].
at::Tensor fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t kv_heads);

}  // namespace hyperparallel::models
