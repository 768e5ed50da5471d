// Pipeline transfers. See stage_transfers.h.
#include "stage_transfers.h"

#include <ATen/ATen.h>

namespace hyperparallel::pp {

StageTransfers::StageTransfers(std::shared_ptr<comm::Communicator> group, int64_t stages)
    : group_(std::move(group)), stages_(stages) {}

int StageTransfers::tag(const TransferId& id) const {
  return static_cast<int>((id.microbatch * stages_ + id.stage) * 2 + static_cast<int64_t>(id.direction));
}

std::string StageTransfers::describe(const TransferId& id, int peer) const {
  const bool activation = id.direction == Direction::kActivation;
  return std::string("waiting for the ") + (activation ? "activations" : "gradients") + " of micro-batch " +
         std::to_string(id.microbatch) + " from stage " + std::to_string(activation ? id.stage - 1 : id.stage + 1) + " on pp rank " +
         std::to_string(peer);
}

void StageTransfers::post(const TransferId& id, int src, const std::vector<int64_t>& shape, at::ScalarType dtype) {
  const int t = tag(id);
  if (received_.count(t)) return;
  Pending pending;
  if (src == group_->rank()) {
    received_.emplace(t, std::move(pending));  // handed over by send() on this rank
    return;
  }
  pending.buffer = at::empty(shape, at::TensorOptions().dtype(dtype));
  pending.handle = group_->recv(pending.buffer, src, t);
  received_.emplace(t, std::move(pending));
}

at::Tensor StageTransfers::take(const TransferId& id, int src, const std::vector<int64_t>& shape, at::ScalarType dtype) {
  post(id, src, shape, dtype);
  const int t = tag(id);
  Pending pending = std::move(received_.at(t));
  received_.erase(t);
  if (src == group_->rank()) {
    auto it = local_.find(t);
    if (it == local_.end()) throw std::logic_error(describe(id, src) + ": nothing was handed over on this rank");
    at::Tensor tensor = std::move(it->second);
    local_.erase(it);
    return tensor;
  }
  try {
    pending.handle.wait();
  } catch (const comm::CommError& e) {
    throw comm::CommError(describe(id, src) + ": " + e.what());
  }
  return pending.buffer;
}

void StageTransfers::send(const TransferId& id, const at::Tensor& tensor, int dst) {
  const at::Tensor data = tensor.detach().contiguous();
  if (dst == group_->rank()) {
    local_[tag(id)] = data.clone();
    return;
  }
  Pending pending;
  pending.buffer = data;
  pending.handle = group_->send(data, dst, tag(id));
  sent_.push_back(std::move(pending));
}

void StageTransfers::finish() {
  for (auto& pending : sent_) {
    try {
      pending.handle.wait();
    } catch (const comm::CommError& e) {
      throw comm::CommError("pipeline: pp rank " + std::to_string(group_->rank()) + " sending to a neighbouring stage: " + e.what());
    }
  }
  sent_.clear();
}

}  // namespace hyperparallel::pp
