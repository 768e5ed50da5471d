// The attention core as one tiled kernel with its own backward. See causal_attention.h.
#include "causal_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "softmax_rows.h"

namespace hyperparallel::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kTilePositions = 128;  // query positions per tile

struct Geometry {
  int64_t batch, kv_heads, rows, dim, keys, seq, groups, past, block, blocks;
};

Geometry geometry(const at::Tensor& q, const at::Tensor& k, int64_t seq) {
  if (q.dim() != 4 || k.dim() != 4 || seq < 1 || q.size(2) % seq != 0 || k.size(2) < seq) {
    throw std::invalid_argument("causal_attention: q [B, KV, T*G, D] and k [B, KV, S >= T, D] for a mask of " + std::to_string(seq) +
                                " query positions; got q " + std::to_string(q.dim()) + "-d with " + std::to_string(q.size(2)) + " rows, k " +
                                std::to_string(k.dim()) + "-d with " + std::to_string(k.size(2)) + " keys");
  }
  Geometry g{};
  g.batch = q.size(0);
  g.kv_heads = q.size(1);
  g.rows = q.size(2);
  g.dim = q.size(3);
  g.keys = k.size(2);
  g.seq = seq;
  g.groups = g.rows / seq;
  g.past = g.keys - seq;
  g.block = std::min(kTilePositions, seq);
  g.blocks = (seq + g.block - 1) / g.block;
  return g;
}

// One tile: `rows` consecutive rows of an item's q from `row0`, the queries of positions
// [pos0, pos0 + positions), attending over keys [0, keys).
struct Tile {
  int64_t row0, rows, pos0, positions, keys;
};

// Visits the tiles of one (batch, KV head) item; `wide` marks the blocks computed over all keys.
template <typename Fn>
void for_each_tile(const Geometry& g, const bool* wide, Fn&& fn) {
  for (int64_t blk = 0; blk < g.blocks; ++blk) {
    const int64_t pos0 = blk * g.block, positions = std::min(g.block, g.seq - pos0);
    const int64_t keys = wide[blk] ? g.keys : g.past + pos0 + positions;
    fn(Tile{pos0 * g.groups, positions * g.groups, pos0, positions, keys});
  }
}

// [B, blocks] bool: the blocks holding a query position that sees no key at all. The eager core
// gives such a row uniform weight over every key of the row, so those tiles skip nothing.
at::Tensor wide_blocks(const at::Tensor& mask, const Geometry& g) {
  const at::Tensor open = mask.select(1, 0).gt(std::numeric_limits<float>::lowest() / 2).any(-1);  // [B or 1, T]
  at::Tensor closed = at::constant_pad_nd(open.logical_not(), {0, g.blocks * g.block - g.seq}, 0);
  closed = closed.view({closed.size(0), g.blocks, g.block}).any(-1);
  return closed.expand({g.batch, g.blocks}).contiguous();
}

// The tile's [rows, keys] probabilities inside an item's [rows, keys] block of `probs`: packed
// from the tile's first row, so tiles never overlap.
at::Tensor tile_probs(const at::Tensor& item_probs, const Geometry& g, const Tile& t) {
  return item_probs.view(-1).narrow(0, t.row0 * g.keys, t.rows * t.keys).view({t.rows, t.keys});
}

at::Tensor scratch_tile(const at::Tensor& scratch, const Tile& t) { return scratch.narrow(0, 0, t.rows * t.keys).view({t.rows, t.keys}); }

// Runs fn(b, h) for every (batch, KV head) item, one after another: the tile GEMMs use every
// BLAS thread and the row kernels split their rows over the threads (see the header).
template <typename Fn>
void for_each_item(const Geometry& g, Fn&& fn) {
  for (int64_t item = 0; item < g.batch * g.kv_heads; ++item) fn(item / g.kv_heads, item % g.kv_heads);
}

// Splits a tile's rows over the threads, in whole positions (a position's rows share a mask row).
template <typename Fn>
void for_each_row_range(const Tile& t, Fn&& fn) {
  const int64_t per_position = t.rows / t.positions;
  at::parallel_for(0, t.positions, 16, [&](int64_t begin, int64_t end) { fn(begin * per_position, (end - begin) * per_position, begin); });
}

int64_t max_tile_size(const Geometry& g) { return g.block * g.groups * g.keys; }

// out = softmax(q kᵀ · scale + mask) v per tile; the probabilities go to `probs` when defined
// (else they overwrite the scores in place). `mask` is contiguous.
at::Tensor attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scaling,
                             const Geometry& g, const at::Tensor& wide, const at::Tensor& probs) {
  at::Tensor out = at::empty_like(q);
  const bool* wide_ptr = wide.data_ptr<bool>();
  const float* mask_ptr = mask.data_ptr<float>();
  const at::Tensor scores = at::empty({max_tile_size(g)}, q.options());
  for_each_item(g, [&](int64_t b, int64_t h) {
    const at::Tensor Q = q[b][h], K = k[b][h], V = v[b][h], O = out[b][h];
    const float* item_mask = mask_ptr + (mask.size(0) == 1 ? 0 : b) * g.seq * g.keys;
    for_each_tile(g, wide_ptr + b * g.blocks, [&](const Tile& t) {
      at::Tensor s = scratch_tile(scores, t);
      at::mm_out(s, Q.narrow(0, t.row0, t.rows), K.narrow(0, 0, t.keys).t());
      at::Tensor p = probs.defined() ? tile_probs(probs[b][h], g, t) : s;
      const float* s_ptr = s.data_ptr<float>();
      float* p_ptr = p.data_ptr<float>();
      for_each_row_range(t, [&](int64_t row, int64_t rows, int64_t position) {
        scaled_masked_softmax(s_ptr + row * t.keys, rows, t.keys, static_cast<float>(scaling), item_mask + (t.pos0 + position) * g.keys,
                              g.keys, t.rows / t.positions, p_ptr + row * t.keys);
      });
      at::Tensor o = O.narrow(0, t.row0, t.rows);
      at::mm_out(o, p, V.narrow(0, 0, t.keys));
    });
  });
  return out;
}

// The eager core's backward, tile by tile: dV += pᵀ dO, dS = softmax'(dO vᵀ) · scale,
// dQ = dS k, dK += dSᵀ q.
variable_list attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& probs,
                                 const at::Tensor& grad_out, double scaling, const Geometry& g, const at::Tensor& wide) {
  at::Tensor dq = at::empty_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  const bool* wide_ptr = wide.data_ptr<bool>();
  const at::Tensor buffer = at::empty({max_tile_size(g)}, q.options());
  for_each_item(g, [&](int64_t b, int64_t h) {
    const at::Tensor Q = q[b][h], K = k[b][h], V = v[b][h], P = probs[b][h], dO = grad_out[b][h];
    const at::Tensor dQ = dq[b][h], dK = dk[b][h], dV = dv[b][h];
    for_each_tile(g, wide_ptr + b * g.blocks, [&](const Tile& t) {
      const at::Tensor p = tile_probs(P, g, t), dOt = dO.narrow(0, t.row0, t.rows);
      dV.narrow(0, 0, t.keys).addmm_(p.t(), dOt);
      at::Tensor ds = scratch_tile(buffer, t);  // dP, then dS in place
      at::mm_out(ds, dOt, V.narrow(0, 0, t.keys).t());
      const float* p_ptr = p.data_ptr<float>();
      float* ds_ptr = ds.data_ptr<float>();
      for_each_row_range(t, [&](int64_t row, int64_t rows, int64_t) {
        scaled_softmax_backward(p_ptr + row * t.keys, ds_ptr + row * t.keys, rows, t.keys, static_cast<float>(scaling), ds_ptr + row * t.keys);
      });
      at::Tensor dqt = dQ.narrow(0, t.row0, t.rows);
      at::mm_out(dqt, ds, K.narrow(0, 0, t.keys));
      dK.narrow(0, 0, t.keys).addmm_(ds.t(), Q.narrow(0, t.row0, t.rows));
    });
  });
  return {dq, dk, dv};
}

// The mask must be the decoder's [B or 1, 1, T, S] for these operands.
void check_mask(const at::Tensor& mask, const Geometry& g) {
  if (mask.size(1) != 1 || mask.size(3) != g.keys || (mask.size(0) != 1 && mask.size(0) != g.batch)) {
    throw std::invalid_argument("causal_attention: the mask must be [B or 1, 1, T, " + std::to_string(g.keys) + "]; got [" +
                                std::to_string(mask.size(0)) + ", " + std::to_string(mask.size(1)) + ", " + std::to_string(mask.size(2)) +
                                ", " + std::to_string(mask.size(3)) + "]");
  }
}

// k or v as the kernel reads them: each item's [S, D] rows packed (a narrow over keys, as
// context parallelism passes, stays a view), else a contiguous copy.
at::Tensor packed_rows(const at::Tensor& t) { return t.stride(3) == 1 && t.stride(2) == t.size(3) ? t : t.contiguous(); }

struct CausalAttentionFunction : torch::autograd::Function<CausalAttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                            const at::Tensor& mask, double scaling) {
    const at::Tensor q = q_in.contiguous(), k = packed_rows(k_in), v = packed_rows(v_in), m = mask.contiguous();
    const Geometry g = geometry(q, k, mask.size(2));
    check_mask(m, g);
    const at::Tensor wide = wide_blocks(m, g);
    const at::Tensor probs = at::empty({g.batch, g.kv_heads, g.rows, g.keys}, q.options());
    at::Tensor out = attention_forward(q, k, v, m, scaling, g, wide, probs);
    ctx->save_for_backward({q, k, v, probs});
    ctx->saved_data["wide"] = wide;
    ctx->saved_data["scaling"] = scaling;
    ctx->saved_data["seq"] = mask.size(2);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const Geometry g = geometry(saved[0], saved[1], ctx->saved_data["seq"].toInt());
    variable_list result = attention_backward(saved[0], saved[1], saved[2], saved[3], grads[0].contiguous(),
                                              ctx->saved_data["scaling"].toDouble(), g, ctx->saved_data["wide"].toTensor());
    result.resize(5);  // no gradient for the mask or the scale
    return result;
  }
};

}  // namespace

bool causal_attention_supports(const at::Tensor& q, const at::Tensor& mask) {
  return q.device().is_cpu() && q.scalar_type() == at::kFloat && mask.defined() && mask.scalar_type() == at::kFloat && mask.dim() == 4 &&
         mask.size(1) == 1 && mask.size(2) > 0;
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scaling) {
  const bool needs_grad = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (needs_grad) return CausalAttentionFunction::apply(q, k, v, mask, scaling);
  const at::Tensor qc = q.contiguous(), kc = packed_rows(k), vc = packed_rows(v), m = mask.contiguous();
  const Geometry g = geometry(qc, kc, mask.size(2));
  check_mask(m, g);
  return attention_forward(qc, kc, vc, m, scaling, g, wide_blocks(m, g), at::Tensor());
}

at::Tensor causal_attention_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scaling) {
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), dim = q.size(3), kv_heads = k.size(1), groups = heads / kv_heads;
  const at::Tensor rows = q.reshape({batch, kv_heads, groups, seq, dim}).transpose(2, 3).reshape({batch, kv_heads, seq * groups, dim});
  return causal_attention(rows, k, v, mask, scaling)
      .view({batch, kv_heads, seq, groups, dim})
      .permute({0, 2, 1, 3, 4})
      .reshape({batch, seq, heads, dim});
}

}  // namespace hyperparallel::models
