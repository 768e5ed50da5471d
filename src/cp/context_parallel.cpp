// The context-parallel attention core and its installation. See cp/context_parallel.h.
#include "hyperparallel/cp/context_parallel.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "block_attention.h"
#include "hyperparallel/dtensor/functional_collectives.h"
#include "hyperparallel/platform/user_error.h"
#include "ring_attention.h"

namespace hyperparallel::cp {
namespace {

// The first index of each chunk cp rank `rank` holds (zigzag), for rows of 2·cp chunks.
std::vector<int64_t> chunk_starts(int64_t cp_size, int64_t rank, int64_t chunk) {
  return {rank * chunk, (2 * cp_size - 1 - rank) * chunk};
}

// [B, H, T, D] sequence-sharded over `group` -> [B, H/u, u·T, D]: this rank's head group, the
// sequence being the members' tokens in group order.
at::Tensor heads_to_sequence(const at::Tensor& x, comm::Communicator& group) {
  const int64_t u = group.size(), batch = x.size(0), heads = x.size(1), seq = x.size(2), dim = x.size(3);
  const at::Tensor send = x.reshape({batch, u, heads / u, seq, dim}).permute({1, 0, 2, 3, 4}).contiguous();
  const std::vector<int64_t> ones(static_cast<size_t>(u), 1);
  const at::Tensor got = dtensor::all_to_all(send.view({u, -1}), group, ones, ones);
  return got.view({u, batch, heads / u, seq, dim}).permute({1, 2, 0, 3, 4}).reshape({batch, heads / u, u * seq, dim});
}

// The inverse: [B, H/u, u·T, D] -> [B, H, T, D].
at::Tensor sequence_to_heads(const at::Tensor& x, comm::Communicator& group) {
  const int64_t u = group.size(), batch = x.size(0), heads = x.size(1), seq = x.size(2) / u, dim = x.size(3);
  const at::Tensor send = x.reshape({batch, heads, u, seq, dim}).permute({2, 0, 1, 3, 4}).contiguous();
  const std::vector<int64_t> ones(static_cast<size_t>(u), 1);
  const at::Tensor got = dtensor::all_to_all(send.view({u, -1}), group, ones, ones);
  return got.view({u, batch, heads, seq, dim}).permute({1, 0, 2, 3, 4}).reshape({batch, u * heads, seq, dim});
}

// Positions, in a sequence made of chunks at `starts`, of the row's tokens in natural order.
at::Tensor natural_order(const std::vector<int64_t>& starts, int64_t chunk) {
  std::vector<int64_t> by_start(starts.size());
  std::iota(by_start.begin(), by_start.end(), 0);
  std::sort(by_start.begin(), by_start.end(), [&](int64_t a, int64_t b) { return starts[a] < starts[b]; });
  std::vector<at::Tensor> parts;
  for (int64_t pos : by_start) parts.push_back(at::arange(pos * chunk, (pos + 1) * chunk, at::kLong));
  return at::cat(parts);
}

std::shared_ptr<comm::Communicator> subgroup(comm::Communicator& cp, const std::vector<int64_t>& members, const std::string& name) {
  std::vector<int> ranks;
  for (int64_t m : members) ranks.push_back(cp.global_ranks()[static_cast<size_t>(m)]);
  return cp.group(ranks, name);
}

class ContextParallelAttention : public models::AttentionCore {
 public:
  ContextParallelAttention(std::shared_ptr<comm::Communicator> cp, bool ring, int64_t ulysses) : cp_(std::move(cp)), ring_(ring), degree_(ulysses) {
    const int64_t n = cp_->size(), me = cp_->rank(), outer = n / degree_;
    std::vector<int64_t> inner_members, outer_members;
    for (int64_t j = 0; j < degree_; ++j) inner_members.push_back(me / degree_ * degree_ + j);
    for (int64_t p = 0; p < outer; ++p) outer_members.push_back(p * degree_ + me % degree_);
    if (degree_ > 1) ulysses_ = subgroup(*cp_, inner_members, "cp_ulysses");
    if (outer > 1) outer_ = degree_ == 1 ? cp_ : subgroup(*cp_, outer_members, ring_ ? "cp_ring" : "cp_allgather");
  }

  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const models::SequenceShard& shard,
                    double scaling) override {
    const int64_t n = cp_->size(), length = shard.full_length, chunk = length / (2 * n);
    check_shard(shard, q, k);
    // The chunks of outer-group rank p: those of its Ulysses group's members, in group order.
    const auto group_starts = [&](int64_t p) {
      std::vector<int64_t> starts;
      const int64_t first = p * degree_;
      for (int64_t j = 0; j < degree_; ++j) {
        for (int64_t s : chunk_starts(n, first + j, chunk)) starts.push_back(s);
      }
      return starts;
    };
    const int64_t outer = n / degree_, my_group = cp_->rank() / degree_;
    at::Tensor qs = q, ks = k, vs = v;
    if (ulysses_) {
      qs = heads_to_sequence(q, *ulysses_);
      ks = heads_to_sequence(k, *ulysses_);
      vs = heads_to_sequence(v, *ulysses_);
    }
    at::Tensor out;
    if (outer > 1 && ring_) {
      RingLayout layout;
      layout.chunk = chunk;
      for (int64_t p = 0; p < outer; ++p) layout.starts.push_back(group_starts(p));
      out = ring_attention(qs, ks, vs, layout, outer_, shard, scaling);
    } else {
      std::vector<int64_t> key_starts;
      if (outer > 1) {  // all-gather K and V over the outer group (backward: reduce-scatter dK, dV)
        ks = dtensor::all_gather_into(ks, 2, *outer_);
        vs = dtensor::all_gather_into(vs, 2, *outer_);
      }
      for (int64_t p = outer > 1 ? 0 : my_group; p < (outer > 1 ? outer : my_group + 1); ++p) {
        for (int64_t s : group_starts(p)) key_starts.push_back(s);
      }
      const at::Tensor order = natural_order(key_starts, chunk);
      out = causal_attention(qs, group_starts(my_group), ks.index_select(2, order), vs.index_select(2, order), chunk, shard, scaling);
    }
    if (ulysses_) out = sequence_to_heads(out, *ulysses_);
    return out.transpose(1, 2).reshape({q.size(0), q.size(2), -1});
  }

 private:
  // Every layer (and recompute) of a forward passes the same shard: its layout is checked once.
  void check_shard(const models::SequenceShard& shard, const at::Tensor& q, const at::Tensor& k) {
    const int64_t n = cp_->size();
    if (checked_index_.is_same(shard.index)) {
      // checked already
    } else if (shard.full_length % (2 * n) != 0 || !zigzag_index(shard.full_length, n, cp_->rank()).equal(shard.index)) {
      throw UserError("context parallelism: the sequence shard is not cp rank " + std::to_string(cp_->rank()) + "'s zigzag share of " +
                      std::to_string(n) + " ranks; make inputs with cp::shard_sequence");
    } else {
      checked_index_ = shard.index;
    }
    if (q.size(1) % degree_ != 0 || k.size(1) % degree_ != 0) {
      throw UserError("context parallelism: Ulysses degree " + std::to_string(degree_) + " does not divide this rank's " +
                      std::to_string(q.size(1)) + " heads and " + std::to_string(k.size(1)) + " kv heads; valid degrees: " +
                      valid_ulysses_degrees(q.size(1), k.size(1), n));
    }
  }

  std::shared_ptr<comm::Communicator> cp_, ulysses_, outer_;
  at::Tensor checked_index_;  // the last shard index found to be this rank's zigzag share
  bool ring_;
  int64_t degree_;
};

}  // namespace

void parallelize_context(models::CausalLM& model, std::shared_ptr<comm::Communicator> cp, const ContextParallelOptions& o) {
  if (!cp) throw UserError("parallelize_context: no cp communicator");
  const int64_t degree = resolved_ulysses_degree(o, cp->size());
  const models::ModelConfig& c = model.config();
  const int64_t split = std::max<int64_t>(1, o.head_split);
  // Tensor parallelism with fewer kv heads than ranks keeps one (replicated) kv head per rank.
  const int64_t heads = c.num_attention_heads / split, kv_heads = std::max<int64_t>(1, c.num_key_value_heads / split);
  if (heads % degree != 0 || kv_heads % degree != 0) {
    throw UserError("context parallelism: Ulysses degree " + std::to_string(degree) + " must divide each rank's " +
                    std::to_string(heads) + " attention heads and " + std::to_string(kv_heads) + " kv heads (" +
                    std::to_string(c.num_attention_heads) + " and " + std::to_string(c.num_key_value_heads) + " over " +
                    std::to_string(split) + " tensor-parallel ranks); valid degrees for " + std::to_string(cp->size()) +
                    " cp ranks: " + valid_ulysses_degrees(heads, kv_heads, cp->size()) +
                    (o.algorithm == "ulysses" ? "; or use cp_algorithm ring or allgather" : ""));
  }
  model.set_attention_core(std::make_shared<ContextParallelAttention>(std::move(cp), o.algorithm == "ring" || o.algorithm == "hybrid", degree));
}

}  // namespace hyperparallel::cp
