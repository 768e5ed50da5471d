#include "fsdp_root.h"

#include <torch/csrc/autograd/engine.h>

#include <algorithm>

#include "fsdp_unit.h"

namespace hyperparallel::fsdp {

int FSDPRoot::position(FSDPUnit* unit) const {
  auto it = std::find(forward_order_.begin(), forward_order_.end(), unit);
  return it == forward_order_.end() ? -1 : static_cast<int>(it - forward_order_.begin());
}

void FSDPRoot::prefetch(FSDPUnit* unit, const std::optional<std::vector<FSDPUnit*>>& explicit_list, int depth,
                        int direction) {
  // A unit whose gradients are reduced is done for this step (a pipeline stage's root may start
  // backward again after a unit's last backward of the step): prefetch leaves it alone.
  const auto gather_ahead = [](FSDPUnit* other) {
    if (!other->reduced_since_forward()) other->unshard_async();
  };
  if (explicit_list) {
    for (FSDPUnit* other : *explicit_list) gather_ahead(other);
    return;
  }
  // The root runs first in forward and in backward and is not in the recorded order: it
  // stands before the first unit going forward and after the last going backward, so its
  // pre-backward gathers the last units while the head's backward runs.
  const int last = static_cast<int>(forward_order_.size());
  const int at = unit->is_root() ? (direction > 0 ? -1 : last) : position(unit);
  if (at < 0 && !unit->is_root()) return;
  for (int d = 1; d <= depth; ++d) {
    const int other = at + direction * d;
    if (other >= 0 && other < static_cast<int>(forward_order_.size())) gather_ahead(forward_order_[other]);
  }
}

void FSDPRoot::on_pre_forward(FSDPUnit* unit) {
  if (unit->is_root()) {  // the root's forward starts a step: every unit may be gathered again
    for (FSDPUnit* u : units_) u->start_step();
  }
  if (!order_final_) {
    if (!unit->is_root() && position(unit) < 0) forward_order_.push_back(unit);
    return;  // no prefetch before the order is known
  }
  prefetch(unit, unit->settings().forward_prefetch, unit->settings().forward_prefetch_depth, +1);
}

void FSDPRoot::on_pre_backward(FSDPUnit* unit) {
  if (!callback_queued_) {
    callback_queued_ = true;
    order_final_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
  }
  prefetch(unit, unit->settings().backward_prefetch, unit->settings().backward_prefetch_depth, -1);
}

void FSDPRoot::finish_backward() {
  callback_queued_ = false;
  for (FSDPUnit* unit : units_) unit->finish_reduce_scatter();
  for (FSDPUnit* unit : units_) unit->finish_backward();
}

void FSDPRoot::unsharded_acquired(FSDPUnit* unit) {
  if (unit->is_root()) return;
  max_live_ = std::max(max_live_, ++live_);
}

void FSDPRoot::unsharded_released(FSDPUnit* unit) {
  if (unit->is_root()) return;
  --live_;
}

}  // namespace hyperparallel::fsdp
