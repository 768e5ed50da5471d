// Ring attention with its own backward. See ring_attention.h.
#include "ring_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>

#include "block_attention.h"

namespace hyperparallel::cp {
namespace {

constexpr int kKeyValueTag = 1, kGradientTag = 2;

struct RingState : torch::CustomClassHolder {
  RingLayout layout;
  std::shared_ptr<comm::Communicator> ring;
  models::SequenceShard shard;  // by value: the backward runs after the forward's inputs are gone
  double scaling = 1;
};

// One rank's queries, split into their chunks and grouped by kv head.
std::vector<at::Tensor> query_chunks(const at::Tensor& q, int64_t count, int64_t chunk, int64_t kv_heads) {
  std::vector<at::Tensor> out;
  for (int64_t a = 0; a < count; ++a) out.push_back(group_queries(q.narrow(2, a * chunk, chunk), kv_heads).contiguous());
  return out;
}

// Calls `visit(a, b, visible)` for each computed pair of query chunk a of this rank and key
// chunk b of ring rank `source`; `visible` is undefined where every key is visible.
template <typename Visit>
void for_each_block(const RingState& st, int64_t source, const Visit& visit) {
  const auto& mine = st.layout.starts[static_cast<size_t>(st.ring->rank())];
  const auto& theirs = st.layout.starts[static_cast<size_t>(source)];
  const int64_t c = st.layout.chunk;
  const bool masked = st.shard.documents.defined() || st.shard.valid.defined();
  for (size_t a = 0; a < mine.size(); ++a) {
    for (size_t b = 0; b < theirs.size(); ++b) {
      const BlockKind kind = block_kind(mine[a], theirs[b]);
      if (kind == BlockKind::kHidden) continue;
      const at::Tensor visible =
          kind == BlockKind::kDiagonal || masked
              ? visible_keys(st.shard, at::arange(mine[a], mine[a] + c, at::kLong), at::arange(theirs[b], theirs[b] + c, at::kLong))
              : at::Tensor();
      if (visible.defined() && !visible.any().item<bool>()) continue;  // other documents or padding only
      visit(static_cast<int64_t>(a), static_cast<int64_t>(b), visible);
    }
  }
}

// Sends `block` on to the next rank and receives the previous rank's into a new tensor.
struct Pass {
  at::Tensor incoming;
  comm::CommHandle sent, received;
  void wait() {
    sent.wait();
    received.wait();
  }
};

Pass pass_on(comm::Communicator& ring, const at::Tensor& block, int tag) {
  const int n = ring.size(), r = ring.rank();
  Pass p;
  p.incoming = at::empty_like(block);
  p.sent = ring.send(block, (r + 1) % n, tag);
  p.received = ring.recv(p.incoming, (r + n - 1) % n, tag);
  return p;
}

struct RingAttentionFunction : torch::autograd::Function<RingAttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            c10::intrusive_ptr<RingState> st) {
    const int64_t heads = q.size(1), kv_heads = k.size(1), groups = heads / kv_heads, c = st->layout.chunk;
    const int n = st->ring->size(), r = st->ring->rank();
    const std::vector<at::Tensor> qg = query_chunks(q.to(at::kFloat), q.size(2) / c, c, kv_heads);
    std::vector<SoftmaxState> states;
    for (const auto& part : qg) {
      const auto rows = part.sizes().vec();
      states.push_back({at::zeros(part.sizes(), part.options()),
                        at::full({rows[0], rows[1], rows[2], 1}, -std::numeric_limits<float>::infinity(), part.options()),
                        at::zeros({rows[0], rows[1], rows[2], 1}, part.options())});
    }
    const int64_t kv_numel = k.numel();
    at::Tensor kv = at::cat({k.reshape({-1}), v.reshape({-1})}).to(at::kFloat);
    for (int s = 0; s < n; ++s) {
      const int source = (r - s + n) % n;
      Pass pass;
      if (s + 1 < n) pass = pass_on(*st->ring, kv, kKeyValueTag);
      const at::Tensor kb = kv.narrow(0, 0, kv_numel).view(k.sizes()), vb = kv.narrow(0, kv_numel, kv_numel).view(k.sizes());
      for_each_block(*st, source, [&](int64_t a, int64_t b, const at::Tensor& visible) {
        fold_block(states[a], qg[a], kb.narrow(2, b * c, c), vb.narrow(2, b * c, c), visible, groups, st->scaling);
      });
      if (s + 1 < n) {
        pass.wait();
        kv = pass.incoming;
      }
    }
    std::vector<at::Tensor> outs, lses, result;
    for (const auto& state : states) {
      auto [out, lse] = finish(state);
      result.push_back(ungroup_queries(out, heads));
      outs.push_back(out);
      lses.push_back(lse);
    }
    ctx->save_for_backward({q, k, v, at::stack(outs), at::stack(lses)});
    ctx->saved_data["state"] = at::IValue::make_capsule(st);
    return at::cat(result, 2).to(q.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    auto st = c10::static_intrusive_pointer_cast<RingState>(ctx->saved_data["state"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &outs = saved[3], &lses = saved[4];
    const int64_t heads = q.size(1), kv_heads = k.size(1), groups = heads / kv_heads, c = st->layout.chunk;
    const int n = st->ring->size(), r = st->ring->rank();
    const int64_t count = q.size(2) / c;
    const std::vector<at::Tensor> qg = query_chunks(q.to(at::kFloat), count, c, kv_heads);
    const std::vector<at::Tensor> dog = query_chunks(grads[0].to(at::kFloat), count, c, kv_heads);
    std::vector<at::Tensor> dq, delta;
    for (int64_t a = 0; a < count; ++a) {
      dq.push_back(at::zeros_like(qg[a]));
      delta.push_back((dog[a] * outs[a]).sum(-1, true));
    }
    const int64_t kv_numel = k.numel();
    at::Tensor kv = at::cat({k.reshape({-1}), v.reshape({-1})}).to(at::kFloat);
    Pass gradient;  // the partial dK/dV of the block this rank holds next, from r - 1
    for (int s = 0; s < n; ++s) {
      const int source = (r - s + n) % n;
      Pass pass;
      if (s + 1 < n) pass = pass_on(*st->ring, kv, kKeyValueTag);
      const at::Tensor kb = kv.narrow(0, 0, kv_numel).view(k.sizes()), vb = kv.narrow(0, kv_numel, kv_numel).view(k.sizes());
      at::Tensor dkv = at::zeros_like(kv);
      at::Tensor dk = dkv.narrow(0, 0, kv_numel).view(k.sizes()), dv = dkv.narrow(0, kv_numel, kv_numel).view(k.sizes());
      for_each_block(*st, source, [&](int64_t a, int64_t b, const at::Tensor& visible) {
        at::Tensor dkb = dk.narrow(2, b * c, c), dvb = dv.narrow(2, b * c, c);
        block_backward(qg[a], kb.narrow(2, b * c, c), vb.narrow(2, b * c, c), visible, lses[a], dog[a], delta[a], groups,
                       st->scaling, dq[a], dkb, dvb);
      });
      if (s > 0) {
        gradient.wait();
        dkv.add_(gradient.incoming);
      }
      gradient = pass_on(*st->ring, dkv, kGradientTag);  // the last one takes each block home
      if (s + 1 < n) {
        pass.wait();
        kv = pass.incoming;
      }
    }
    gradient.wait();
    const at::Tensor home = gradient.incoming;
    std::vector<at::Tensor> dq_parts;
    for (const auto& part : dq) dq_parts.push_back(ungroup_queries(part, heads));
    return {at::cat(dq_parts, 2).to(q.scalar_type()), home.narrow(0, 0, kv_numel).view(k.sizes()).to(k.scalar_type()),
            home.narrow(0, kv_numel, kv_numel).view(k.sizes()).to(v.scalar_type()), at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RingLayout& layout,
                          std::shared_ptr<comm::Communicator> ring, const models::SequenceShard& shard, double scaling) {
  auto st = c10::make_intrusive<RingState>();
  st->layout = layout;
  st->ring = std::move(ring);
  st->shard = shard;
  st->scaling = scaling;
  return RingAttentionFunction::apply(q.contiguous(), k.contiguous(), v.contiguous(), st);
}

}  // namespace hyperparallel::cp
