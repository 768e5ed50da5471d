// All-to-all token dispatch and combine. See token_dispatch.h.
#include "token_dispatch.h"

#include <ATen/ATen.h>

#include <vector>

#include "hyperparallel/dtensor/functional_collectives.h"
#include "hyperparallel/dtensor/placement.h"
#include "models/grouped_experts.h"

namespace hyperparallel::ep {
namespace {

std::vector<int64_t> as_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// Sums of consecutive groups of `group` entries.
std::vector<int64_t> group_sums(const std::vector<int64_t>& v, int64_t group) {
  std::vector<int64_t> out(v.size() / static_cast<size_t>(group), 0);
  for (size_t i = 0; i < v.size(); ++i) out[i / static_cast<size_t>(group)] += v[i];
  return out;
}

// Where the received rows of (source s, local expert l) go when regrouped expert-major:
// `order` lists received row indices expert by expert, `rows_per_expert` their counts.
struct Regrouping {
  at::Tensor order, inverse;
  std::vector<int64_t> rows_per_expert;
};

Regrouping regroup(const std::vector<int64_t>& received, int64_t sources, int64_t local_experts) {
  std::vector<int64_t> start(received.size(), 0);
  for (size_t i = 1; i < received.size(); ++i) start[i] = start[i - 1] + received[i - 1];
  Regrouping r;
  std::vector<int64_t> order;
  for (int64_t l = 0; l < local_experts; ++l) {
    int64_t rows = 0;
    for (int64_t s = 0; s < sources; ++s) {
      const size_t at = static_cast<size_t>(s * local_experts + l);
      for (int64_t i = 0; i < received[at]; ++i) order.push_back(start[at] + i);
      rows += received[at];
    }
    r.rows_per_expert.push_back(rows);
  }
  r.order = at::tensor(order, at::kLong);
  r.inverse = at::empty_like(r.order);
  if (!order.empty()) r.inverse.index_put_({r.order}, at::arange(static_cast<int64_t>(order.size()), at::kLong));
  return r;
}

}  // namespace

AllToAllDispatch::AllToAllDispatch(std::shared_ptr<comm::Communicator> ep, std::shared_ptr<comm::Communicator> token_split)
    : ep_(std::move(ep)), token_split_(std::move(token_split)) {
  if (token_split_ && token_split_->size() == 1) token_split_ = nullptr;
}

at::Tensor AllToAllDispatch::combine(models::SparseMoeBlock& block, const at::Tensor& tokens, const models::Routing& routing) {
  if (!token_split_) return combine_own(block, tokens, routing);
  // This rank's slice of the shared tokens; the gradients of the slices are gathered back.
  comm::Communicator& group = *token_split_;
  const int64_t rows = tokens.size(0);
  const int64_t first = dtensor::shard_offset(rows, group.size(), group.rank());
  const int64_t count = dtensor::shard_length(rows, group.size(), group.rank());
  models::Routing mine{routing.selected.narrow(0, first, count), dtensor::local_shard(routing.weights, 0, group),
                       routing.kept.defined() ? routing.kept.narrow(0, first, count) : at::Tensor()};
  const at::Tensor out = combine_own(block, dtensor::local_shard(tokens, 0, group), mine);
  dtensor::AllGatherOptions gather;
  gather.global_size = rows;
  gather.grad = dtensor::GradIs::kReplicate;
  return dtensor::all_gather_into(out, 0, group, gather);
}

at::Tensor AllToAllDispatch::combine_own(models::SparseMoeBlock& block, const at::Tensor& tokens, const models::Routing& routing) {
  const int64_t ranks = ep_->size(), local_experts = block.local_count;
  const models::SortedPairs pairs = models::sort_pairs_by_expert(routing, block.num_experts);
  // Counts per expert, exchanged: received[s * L + l] rows come from rank s for local expert l.
  const at::Tensor counts = at::tensor(pairs.counts, at::kLong);
  at::Tensor received_counts = at::empty_like(counts);
  ep_->all_to_all(received_counts, counts).wait();
  const std::vector<int64_t> received = as_vector(received_counts);
  const std::vector<int64_t> send_splits = group_sums(pairs.counts, local_experts);
  const std::vector<int64_t> recv_splits = group_sums(received, local_experts);

  const at::Tensor arrived = dtensor::all_to_all(tokens.index_select(0, pairs.token), *ep_, recv_splits, send_splits);
  const Regrouping g = regroup(received, ranks, local_experts);
  const at::Tensor computed = block.run_local_experts(arrived.index_select(0, g.order), g.rows_per_expert);
  const at::Tensor returned = dtensor::all_to_all(computed.index_select(0, g.inverse), *ep_, send_splits, recv_splits);
  return models::sum_weighted_outputs(tokens, pairs, returned, routing);
}

}  // namespace hyperparallel::ep
