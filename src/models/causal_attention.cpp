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
// bf16 tiles of several items go through one batched GEMM while their scores stay under this
// size (see the header); fp32 tiles run one item at a time.
constexpr int64_t kGroupTileBytes = int64_t{4} << 20;

struct Geometry {
  int64_t batch, kv_heads, rows, dim, keys, seq, groups, past, block, blocks;
  int64_t items, group_items;  // (batch, KV head) items, and how many are computed together
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
  g.items = g.batch * g.kv_heads;
  const int64_t item_tile_bytes = g.block * g.groups * g.keys * static_cast<int64_t>(q.element_size());
  g.group_items = q.scalar_type() == at::kFloat ? 1 : std::clamp(kGroupTileBytes / item_tile_bytes, int64_t{1}, g.items);
  return g;
}

// A run of `count` consecutive (batch, KV head) items from `first`, computed together: each of
// their tiles' GEMMs is one batched call for all of them.
struct ItemGroup {
  int64_t first, count;
};

// One tile of each of a group's items: `rows` consecutive rows of the item's q from `row0`, the
// queries of positions [pos0, pos0 + positions), attending over keys [0, keys).
struct Tile {
  int64_t row0, rows, pos0, positions, keys;
};

// Runs fn(group) over the items, one group after another: the tile GEMMs use every BLAS thread
// and the row kernels split their rows over the threads (see the header).
template <typename Fn>
void for_each_group(const Geometry& g, Fn&& fn) {
  for (int64_t first = 0; first < g.items; first += g.group_items) fn(ItemGroup{first, std::min(g.group_items, g.items - first)});
}

// Visits the tiles of a group; a block is computed over all keys when `wide` marks it in any of
// the group's batches (the keys that adds are masked for the other rows: exactly zero weight).
template <typename Fn>
void for_each_tile(const Geometry& g, const bool* wide, const ItemGroup& group, Fn&& fn) {
  for (int64_t blk = 0; blk < g.blocks; ++blk) {
    const int64_t pos0 = blk * g.block, positions = std::min(g.block, g.seq - pos0);
    int64_t keys = g.past + pos0 + positions;
    for (int64_t item = group.first; item < group.first + group.count; ++item) {
      if (wide[item / g.kv_heads * g.blocks + blk]) keys = g.keys;
    }
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

// The group's items of a [B, KV, n, D] operand as [count, n, D] (a view).
at::Tensor group_items(const at::Tensor& t, const ItemGroup& group) { return t.flatten(0, 1).narrow(0, group.first, group.count); }

at::Tensor scratch_tile(const at::Tensor& scratch, const ItemGroup& group, const Tile& t) {
  return scratch.narrow(0, 0, group.count * t.rows * t.keys).view({group.count, t.rows, t.keys});
}

int64_t max_tile_size(const Geometry& g) { return g.group_items * g.block * g.groups * g.keys; }

// out = a b item by item ([n, m, k] x [n, k, p]); a single item as a plain GEMM.
void items_mm(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  at::Tensor result = a.size(0) == 1 ? out[0] : out;
  if (a.size(0) == 1) {
    at::mm_out(result, a[0], b[0]);
  } else {
    at::bmm_out(result, a, b);
  }
}

// Splits a group tile's rows over the threads in whole positions (a position's rows share a mask
// row): fn(item, row, rows, position) for runs of rows inside one of the group's items.
template <typename Fn>
void for_each_row_range(const Tile& t, const ItemGroup& group, Fn&& fn) {
  const int64_t per_position = t.rows / t.positions;
  at::parallel_for(0, group.count * t.positions, 16, [&](int64_t begin, int64_t end) {
    while (begin < end) {
      const int64_t item = begin / t.positions, position = begin % t.positions, stop = std::min(end, (item + 1) * t.positions);
      fn(item, position * per_position, (stop - begin) * per_position, position);
      begin = stop;
    }
  });
}


// The fp32 mask rows: row `position` of the group's item `item` ([B or 1, 1, T, S], contiguous).
struct MaskRows {
  const float* data;
  int64_t batch_stride, kv_heads, keys;
  const float* row(const ItemGroup& group, int64_t item, int64_t position) const {
    return data + (group.first + item) / kv_heads * batch_stride + position * keys;
  }
};

// Each row's softmax stats (max, 1 / sum), [B, KV, rows, 2] fp32: what the forward keeps for
// the backward instead of the probabilities (16 MiB a layer for 2 x 512 tokens of 8 x 64
// heads in fp32, against 64 KiB), which then recomputes them tile by tile bit for bit.
struct RowStats {
  float* data;  // null: not kept
  int64_t rows_per_item;
  float* at(const ItemGroup& group, int64_t item, int64_t row) const {
    return data ? data + ((group.first + item) * rows_per_item + row) * 2 : nullptr;
  }
};

// p = softmax(s · scale + mask) over a group tile's rows, split over the threads; s and p are
// [count, rows, keys], fp32 or bf16 (then each row is widened into fp32 in cache and the
// probabilities rounded once). `stats` get each row's stats, or with `from_stats` give them
// (the backward's recomputation: the forward's probabilities, bit for bit).
void softmax_tile(const at::Tensor& s, const at::Tensor& p, const ItemGroup& group, const Tile& t, float scale, const MaskRows& mask,
                  const RowStats& stats, bool from_stats) {
  const int64_t per_position = t.rows / t.positions;
  const bool fp32 = s.scalar_type() == at::kFloat;
  for_each_row_range(t, group, [&](int64_t item, int64_t row, int64_t rows, int64_t position) {
    const float* m = mask.row(group, item, t.pos0 + position);
    const int64_t at = (item * t.rows + row) * t.keys;
    float* st = stats.at(group, item, t.row0 + row);
    if (fp32 && from_stats) {
      scaled_masked_softmax_from_stats(s.data_ptr<float>() + at, rows, t.keys, scale, m, mask.keys, per_position, st, p.data_ptr<float>() + at);
    } else if (fp32) {
      scaled_masked_softmax(s.data_ptr<float>() + at, rows, t.keys, scale, m, mask.keys, per_position, p.data_ptr<float>() + at, st);
    } else if (from_stats) {
      scaled_masked_softmax_from_stats_bf16(bf16_bits(s) + at, rows, t.keys, scale, m, mask.keys, per_position, st, bf16_bits(p) + at);
    } else {
      scaled_masked_softmax_bf16(bf16_bits(s) + at, rows, t.keys, scale, m, mask.keys, per_position, bf16_bits(p) + at, st);
    }
  });
}

// ds = softmax'(dp) · scale over a group tile's rows in place of dp (fp32 or bf16, as softmax_tile).
void softmax_backward_tile(const at::Tensor& p, const at::Tensor& ds, const ItemGroup& group, const Tile& t, float scale) {
  const bool fp32 = p.scalar_type() == at::kFloat;
  for_each_row_range(t, group, [&](int64_t item, int64_t row, int64_t rows, int64_t) {
    const int64_t at = (item * t.rows + row) * t.keys;
    if (fp32) {
      scaled_softmax_backward(p.data_ptr<float>() + at, ds.data_ptr<float>() + at, rows, t.keys, scale, ds.data_ptr<float>() + at);
    } else {
      scaled_softmax_backward_bf16(bf16_bits(p) + at, bf16_bits(ds) + at, rows, t.keys, scale, bf16_bits(ds) + at);
    }
  });
}

// acc += a b item by item, acc in fp32: in place for fp32 operands; for bf16 ones through the
// product in bf16 (one rounding per tile, as a bf16 GEMM's output) added into the fp32
// accumulator, so the key rows that every later tile adds to are not rounded again at each tile.
void accumulate_product(at::Tensor acc, const at::Tensor& a, const at::Tensor& b, const at::Tensor& scratch) {
  if (a.scalar_type() == acc.scalar_type()) {
    if (a.size(0) == 1) {
      acc[0].addmm_(a[0], b[0]);
    } else {
      acc.baddbmm_(a, b);
    }
    return;
  }
  const at::Tensor product = scratch.narrow(0, 0, a.size(0) * a.size(1) * b.size(2)).view({a.size(0), a.size(1), b.size(2)});
  items_mm(product, a, b);
  acc.add_(product);
}

// out = softmax(q kᵀ · scale + mask) v per tile, the probabilities in place of the scores;
// each row's softmax stats go to `stats` when defined. `mask` is contiguous.
at::Tensor attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scaling,
                             const Geometry& g, const at::Tensor& wide, const at::Tensor& stats) {
  at::Tensor out = at::empty_like(q);
  const MaskRows mask_rows{mask.data_ptr<float>(), mask.size(0) == 1 ? 0 : g.seq * g.keys, g.kv_heads, g.keys};
  const RowStats row_stats{stats.defined() ? stats.data_ptr<float>() : nullptr, g.rows};
  const at::Tensor scores = at::empty({max_tile_size(g)}, q.options());
  for_each_group(g, [&](const ItemGroup& group) {
    const at::Tensor Q = group_items(q, group), K = group_items(k, group), V = group_items(v, group), O = group_items(out, group);
    for_each_tile(g, wide.data_ptr<bool>(), group, [&](const Tile& t) {
      const at::Tensor s = scratch_tile(scores, group, t);
      items_mm(s, Q.narrow(1, t.row0, t.rows), K.narrow(1, 0, t.keys).transpose(1, 2));
      softmax_tile(s, s, group, t, static_cast<float>(scaling), mask_rows, row_stats, false);
      items_mm(O.narrow(1, t.row0, t.rows), s, V.narrow(1, 0, t.keys));
    });
  });
  return out;
}

// The eager core's backward, tile by tile: p again from q kᵀ and the forward's row stats (the
// same GEMM and the same row function: the same bits), dV += pᵀ dO, dS = softmax'(dO vᵀ) ·
// scale, dQ = dS k, dK += dSᵀ q; dK and dV add up in fp32.
variable_list attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                 const at::Tensor& stats, const at::Tensor& grad_out, double scaling, const Geometry& g,
                                 const at::Tensor& wide) {
  const at::TensorOptions fp32 = k.options().dtype(at::kFloat);
  at::Tensor dq = at::empty_like(q), dk = at::zeros(k.sizes(), fp32), dv = at::zeros(v.sizes(), fp32);
  const MaskRows mask_rows{mask.data_ptr<float>(), mask.size(0) == 1 ? 0 : g.seq * g.keys, g.kv_heads, g.keys};
  const RowStats row_stats{stats.data_ptr<float>(), g.rows};
  const at::Tensor probs = at::empty({max_tile_size(g)}, q.options()), buffer = at::empty({max_tile_size(g)}, q.options());
  const at::Tensor product = at::empty({g.group_items * g.keys * g.dim}, q.options());  // the tile's dK or dV terms, for bf16
  for_each_group(g, [&](const ItemGroup& group) {
    const at::Tensor Q = group_items(q, group), K = group_items(k, group), V = group_items(v, group), dO = group_items(grad_out, group);
    const at::Tensor dQ = group_items(dq, group), dK = group_items(dk, group), dV = group_items(dv, group);
    for_each_tile(g, wide.data_ptr<bool>(), group, [&](const Tile& t) {
      const at::Tensor dOt = dO.narrow(1, t.row0, t.rows), Qt = Q.narrow(1, t.row0, t.rows);
      const at::Tensor p = scratch_tile(probs, group, t);
      items_mm(p, Qt, K.narrow(1, 0, t.keys).transpose(1, 2));
      softmax_tile(p, p, group, t, static_cast<float>(scaling), mask_rows, row_stats, true);
      accumulate_product(dV.narrow(1, 0, t.keys), p.transpose(1, 2), dOt, product);
      const at::Tensor ds = scratch_tile(buffer, group, t);  // dP, then dS in place
      items_mm(ds, dOt, V.narrow(1, 0, t.keys).transpose(1, 2));
      softmax_backward_tile(p, ds, group, t, static_cast<float>(scaling));
      items_mm(dQ.narrow(1, t.row0, t.rows), ds, K.narrow(1, 0, t.keys));
      accumulate_product(dK.narrow(1, 0, t.keys), ds.transpose(1, 2), Qt, product);
    });
  });
  return {dq, dk.to(k.scalar_type()), dv.to(v.scalar_type())};
}

// The mask must be the decoder's [B or 1, 1, T, S] for these operands, and k and v of q's dtype.
void check_operands(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, const Geometry& g) {
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type()) {
    throw std::invalid_argument(std::string("causal_attention: q, k and v must have one dtype; got ") + c10::toString(q.scalar_type()) + ", " +
                                c10::toString(k.scalar_type()) + ", " + c10::toString(v.scalar_type()));
  }
  if (mask.size(1) != 1 || mask.size(3) != g.keys || (mask.size(0) != 1 && mask.size(0) != g.batch)) {
    throw std::invalid_argument("causal_attention: the mask must be [B or 1, 1, T, " + std::to_string(g.keys) + "]; got [" +
                                std::to_string(mask.size(0)) + ", " + std::to_string(mask.size(1)) + ", " + std::to_string(mask.size(2)) +
                                ", " + std::to_string(mask.size(3)) + "]");
  }
}

// k or v as the kernel reads them: each item's [S, D] rows packed (a narrow over keys, as
// context parallelism passes, stays a view), else a contiguous copy.
at::Tensor packed_rows(const at::Tensor& t) { return t.stride(3) == 1 && t.stride(2) == t.size(3) ? t : t.contiguous(); }

// The mask as the row kernels read it: contiguous fp32 (a bf16 mask widens exactly).
at::Tensor fp32_mask(const at::Tensor& mask) { return mask.to(at::kFloat).contiguous(); }

struct CausalAttentionFunction : torch::autograd::Function<CausalAttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                            const at::Tensor& mask, double scaling) {
    const at::Tensor q = q_in.contiguous(), k = packed_rows(k_in), v = packed_rows(v_in), m = fp32_mask(mask);
    const Geometry g = geometry(q, k, mask.size(2));
    check_operands(q, k, v, m, g);
    const at::Tensor wide = wide_blocks(m, g);
    const at::Tensor stats = at::empty({g.batch, g.kv_heads, g.rows, 2}, q.options().dtype(at::kFloat));
    at::Tensor out = attention_forward(q, k, v, m, scaling, g, wide, stats);
    ctx->save_for_backward({q, k, v, mask, stats});  // the caller's mask: usually one tensor for every layer
    ctx->saved_data["wide"] = wide;
    ctx->saved_data["scaling"] = scaling;
    ctx->saved_data["seq"] = mask.size(2);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const Geometry g = geometry(saved[0], saved[1], ctx->saved_data["seq"].toInt());
    variable_list result = attention_backward(saved[0], saved[1], saved[2], fp32_mask(saved[3]), saved[4], grads[0].contiguous(),
                                              ctx->saved_data["scaling"].toDouble(), g, ctx->saved_data["wide"].toTensor());
    result.resize(5);  // no gradient for the mask or the scale
    return result;
  }
};

}  // namespace

bool causal_attention_supports(const at::Tensor& q, const at::Tensor& mask) {
  const auto floating = [](const at::Tensor& t) { return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16; };
  return q.device().is_cpu() && floating(q) && mask.defined() && floating(mask) && mask.dim() == 4 && mask.size(1) == 1 && mask.size(2) > 0;
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scaling) {
  const bool needs_grad = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (needs_grad) return CausalAttentionFunction::apply(q, k, v, mask, scaling);
  const at::Tensor qc = q.contiguous(), kc = packed_rows(k), vc = packed_rows(v), m = fp32_mask(mask);
  const Geometry g = geometry(qc, kc, mask.size(2));
  check_operands(qc, kc, vc, m, g);
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
