// causal_attention: the attention core (scores = q kᵀ · scale + mask, softmax, times v) as one
// kernel with its own backward, for fp32 and bf16 on the CPU. Attention (the eager path),
// FusedQKVAttention and context parallelism's Ulysses and all-gather cores run through it.
//
// Why a kernel and not ATen's batched ops: LibTorch's CPU bmm without MKL runs one GEMM per
// (batch, head) matrix, and every step between the two products (scale, mask add, softmax, and
// their backward) is a full pass over [B, H, T, S] tensors in memory. Here the work goes in
// tiles of 128 query positions (all G query heads of a KV head at once): the tile's scores are
// one GEMM, the scale, mask and softmax one pass over them while they are in cache
// (softmax_rows.h), and the tile sees only the keys up to its last position, skipping the
// masked upper triangle (3/8 of the score work at T = 512). Tiles run one after another with
// the GEMMs on every BLAS thread and the row kernels split over the threads: whole items per
// thread with single-threaded GEMMs measured slower on 2 cores (a [4 x 8 x 512 x 64] core,
// forward + backward: 50 vs 45 ms), and 128 positions beat 64 and 256.
//
// bf16: the tile GEMMs run in bf16 (the CPU's fast bf16 matmul, as the eager core's batched
// products do), each tile's scores widened into fp32 in cache for the scale, mask and softmax,
// the probabilities rounded to bf16 once (and kept in bf16 for backward: half the eager core's
// fp32 softmax output); dK and dV add up over the tiles in fp32 and are rounded once at the end.
// A bf16 GEMM call through oneDNN costs ~15 us before any work (measured on an AVX512_BF16 CPU:
// a [256 x 64] x [64 x 128] product takes 20 us alone, 6.6 us per item batched over 16), so in
// bf16 the same tile of several items (up to 4 MB of scores) is one batched call; a block is
// then computed over the widest key range any of those items needs (the extra keys are masked:
// exactly zero weight). fp32 GEMMs gain nothing from batching, so fp32 runs item by item.
// The result is the eager bf16 core's function with fewer roundings on the way
// (Models.CausalAttentionInBf16IsAsCloseToFp32AsTheEagerBf16Core).
//
// Same function as the eager core: the masked entries a tile skips have exactly zero weight
// there, so every probability is the same function of the same scores; a tile holding a query
// row with no visible key (a left-padded position) is computed over all keys, as the eager
// core spreads such a row's weight uniformly over the whole row. Results agree with the eager
// core to float rounding (Models.CausalAttentionMatchesTheEagerCore). The probabilities are
// not kept for backward (the eager core's softmax output is [B, H, T, S]: 16 MiB a layer for
// 2 x 512 tokens of 8 heads in fp32); each row's maximum and inverse sum are, and the backward
// recomputes each tile's scores with the same GEMM and its probabilities with the same row
// function from those stats: the forward's probabilities bit for bit, for one more tile GEMM
// and one pass (Models.AttentionBackwardRecomputesTheForwardProbabilitiesExactly).
//
// Layout: q is [B, KV, T * G, D], the G query heads of each KV head position-major (row
// t * G + g); k and v [B, KV, S, D] with S = past + T (each item's [S, D] rows packed, other
// strides are copied); the mask is the additive [B or 1, 1, T, S] the decoder builds, and must
// be causal (a query at position t sees no key after past + t). Returns [B, KV, T * G, D] in
// q's row order. The backward is first order only (no create_graph through it).
#pragma once

#include <ATen/core/Tensor.h>

namespace hyperparallel::models {

// Whether causal_attention runs these operands (fp32 or bf16 CPU q, an fp32 or bf16
// [B or 1, 1, T >= 1, S] mask); others take the eager ops.
bool causal_attention_supports(const at::Tensor& q, const at::Tensor& mask);

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scaling);

// The same on q [B, H, T, D] in head order (query head h on KV head h / G), as the eager path
// and context parallelism hold it; returns [B, T, H, D], the layout the output projection reads.
at::Tensor causal_attention_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scaling);

}  // namespace hyperparallel::models
