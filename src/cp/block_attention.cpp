// Block attention kernels. See block_attention.h.
#include "block_attention.h"

#include <limits>

#include "models/causal_attention.h"
#include "models/decoder.h"

namespace hyperparallel::cp {
namespace {

at::Tensor range(int64_t start, int64_t count) { return at::arange(start, start + count, at::kLong); }

// [B|1, 1, 1, Tq, Tk]: a mask for scores viewed [B, H_kv, G, Tq, Tk].
at::Tensor for_groups(const at::Tensor& visible) {
  return visible.view({visible.size(0), 1, 1, visible.size(2), visible.size(3)});
}

}  // namespace

at::Tensor visible_keys(const models::SequenceShard& shard, const at::Tensor& q_index, const at::Tensor& k_index) {
  const int64_t tq = q_index.numel(), tk = k_index.numel();
  at::Tensor allowed = k_index.view({1, 1, 1, tk}).le(q_index.view({1, 1, tq, 1}));
  if (shard.documents.defined()) {
    const int64_t rows = shard.documents.size(0);
    const at::Tensor dq = shard.documents.index_select(1, q_index).view({rows, 1, tq, 1});
    const at::Tensor dk = shard.documents.index_select(1, k_index).view({rows, 1, 1, tk});
    allowed = allowed.logical_and(dq.eq(dk));
  }
  if (shard.valid.defined()) {
    allowed = allowed.logical_and(shard.valid.index_select(1, k_index).view({shard.valid.size(0), 1, 1, tk}));
  }
  return allowed;
}

at::Tensor group_queries(const at::Tensor& q, int64_t kv_heads) {
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), dim = q.size(3);
  return q.reshape({batch, kv_heads, heads / kv_heads * seq, dim});
}

at::Tensor ungroup_queries(const at::Tensor& qg, int64_t heads) {
  const int64_t batch = qg.size(0), kv_heads = qg.size(1), dim = qg.size(3);
  return qg.reshape({batch, heads, qg.size(2) / (heads / kv_heads), dim});
}

at::Tensor causal_attention(const at::Tensor& q, const std::vector<int64_t>& q_starts, const at::Tensor& k, const at::Tensor& v,
                            int64_t chunk, const models::SequenceShard& shard, double scaling) {
  const int64_t batch = q.size(0), heads = q.size(1), kv_heads = k.size(1), groups = heads / kv_heads;
  const double lowest = models::masked_score(q.scalar_type());
  std::vector<at::Tensor> outs;
  for (size_t i = 0; i < q_starts.size(); ++i) {
    const int64_t keys = q_starts[i] + chunk;  // every key at or before this chunk's last query
    const at::Tensor q_chunk = q.narrow(2, static_cast<int64_t>(i) * chunk, chunk);
    const at::Tensor kc = k.narrow(2, 0, keys), vc = v.narrow(2, 0, keys);
    const at::Tensor hidden = visible_keys(shard, range(q_starts[i], chunk), range(0, keys)).logical_not();
    if (q.device().is_cpu() && q.scalar_type() == at::kFloat) {  // the models' tiled kernel; keys before the chunk are its "past"
      const at::Tensor mask = at::zeros(hidden.sizes(), q.options()).masked_fill_(hidden, lowest);
      outs.push_back(models::causal_attention_heads(q_chunk, kc, vc, mask, scaling).transpose(1, 2));
      continue;
    }
    const at::Tensor qg = group_queries(q_chunk, kv_heads);
    const at::Tensor scores = (at::matmul(qg, kc.transpose(2, 3)) * scaling)
                                  .view({batch, kv_heads, groups, chunk, keys})
                                  .masked_fill(for_groups(hidden), lowest);
    const at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type()).view({batch, kv_heads, groups * chunk, keys});
    outs.push_back(ungroup_queries(at::matmul(probs, vc), heads));
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 2);
}

BlockKind block_kind(int64_t q_start, int64_t k_start) {
  return k_start > q_start ? BlockKind::kHidden : k_start == q_start ? BlockKind::kDiagonal : BlockKind::kBelow;
}

namespace {

at::Tensor block_scores(const at::Tensor& qg, const at::Tensor& k, const at::Tensor& visible, int64_t groups, double scaling) {
  at::Tensor s = at::matmul(qg, k.transpose(2, 3)).mul_(scaling);
  if (visible.defined()) {
    const int64_t batch = s.size(0), kv_heads = s.size(1), rows = s.size(2) / groups, keys = s.size(3);
    s.view({batch, kv_heads, groups, rows, keys}).masked_fill_(for_groups(visible.logical_not()), -std::numeric_limits<float>::infinity());
  }
  return s;
}

at::Tensor without_neg_inf(const at::Tensor& t) { return at::where(at::isneginf(t), at::zeros({}, t.options()), t); }

}  // namespace

void fold_block(SoftmaxState& state, const at::Tensor& qg, const at::Tensor& k, const at::Tensor& v, const at::Tensor& visible,
                int64_t groups, double scaling) {
  const at::Tensor s = block_scores(qg, k, visible, groups, scaling);
  const at::Tensor new_max = at::maximum(state.max, std::get<0>(s.max(-1, true)));
  const at::Tensor shift = without_neg_inf(new_max);
  const at::Tensor p = (s - shift).exp_();
  const at::Tensor correction = (state.max - shift).exp_();
  state.sum = state.sum * correction + p.sum(-1, true);
  state.out = state.out * correction + at::matmul(p, v);
  state.max = new_max;
}

std::pair<at::Tensor, at::Tensor> finish(const SoftmaxState& state) {
  const at::Tensor empty = state.sum.eq(0);
  const at::Tensor out = state.out / at::where(empty, at::ones({}, state.sum.options()), state.sum);
  const at::Tensor lse = without_neg_inf(state.max) + state.sum.log();  // log 0 = -inf for an empty row
  return {out, lse};
}

void block_backward(const at::Tensor& qg, const at::Tensor& k, const at::Tensor& v, const at::Tensor& visible, const at::Tensor& lse,
                    const at::Tensor& d_out, const at::Tensor& delta, int64_t groups, double scaling, at::Tensor& dq, at::Tensor& dk,
                    at::Tensor& dv) {
  const at::Tensor p = (block_scores(qg, k, visible, groups, scaling) - without_neg_inf(lse)).exp_();
  dv.add_(at::matmul(p.transpose(2, 3), d_out));
  const at::Tensor ds = p.mul_(at::matmul(d_out, v.transpose(2, 3)).sub_(delta));
  dq.add_(at::matmul(ds, k), scaling);
  dk.add_(at::matmul(ds.transpose(2, 3), qg), scaling);
}

}  // namespace hyperparallel::cp
