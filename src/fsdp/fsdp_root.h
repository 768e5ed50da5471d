// FSDPRoot: what the units of one model share — created by the first unit to run forward
// (the root), which adopts every unit below it.
//
// It records the units' forward order in the first step and uses it to prefetch: when a
// unit starts forward, the next `forward_prefetch_depth` units' all-gathers are issued (the
// root's forward issues the first units', so the first block's gather overlaps the embedding
// instead of waiting in its own pre-forward); when a unit starts backward, the previous ones'. It queues one autograd-engine callback per
// backward that finishes every unit (waits for the reduce-scatters, points gradients at the
// shards). It owns the warm memory pool and counts live unsharded units for the memory bound.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "flat_buffers.h"

namespace hyperparallel::fsdp {

class FSDPUnit;

class FSDPRoot {
 public:
  explicit FSDPRoot(std::vector<FSDPUnit*> units) : units_(std::move(units)) {}

  void on_pre_forward(FSDPUnit* unit);
  void on_pre_backward(FSDPUnit* unit);
  void finish_backward();
  // Between the first pre-backward of a step and the end of its backward: a forward now is
  // activation recompute (models/recompute.h), not the next step's.
  bool in_backward() const { return callback_queued_; }

  WarmMemoryPool* pool() { return &pool_; }
  void unsharded_acquired(FSDPUnit* unit);
  void unsharded_released(FSDPUnit* unit);
  int max_live_unsharded() const { return max_live_; }
  void reset_max_live() { max_live_ = live_; }

 private:
  int position(FSDPUnit* unit) const;
  // All-gather ahead: the explicit list if set, else `depth` units in `direction` (+1 later
  // in forward order, -1 earlier).
  void prefetch(FSDPUnit* unit, const std::optional<std::vector<FSDPUnit*>>& explicit_list, int depth, int direction);

  std::vector<FSDPUnit*> units_;          // the root first, then module order
  std::vector<FSDPUnit*> forward_order_;  // non-root units, as first seen in forward
  bool order_final_ = false;
  bool callback_queued_ = false;
  WarmMemoryPool pool_;
  int live_ = 0;
  int max_live_ = 0;
};

}  // namespace hyperparallel::fsdp
