// The host pool of swapped layer inputs. See activation_swap.h.
#include "activation_swap.h"

#include <ATen/ATen.h>

#include <iterator>
#include <stdexcept>
#include <string>

namespace hyperparallel::models {

int64_t ActivationSwapPool::stash(const at::Tensor& input) {
  Slot slot;
  slot.host = at::empty_like(input, at::MemoryFormat::Contiguous).copy_(input);
  traffic_.bytes_out += static_cast<int64_t>(input.nbytes());
  ++traffic_.stashed;
  slots_.emplace(next_, std::move(slot));
  return next_++;
}

void ActivationSwapPool::bring_back(Slot& slot) {
  slot.device = slot.host.clone();
  traffic_.bytes_in += static_cast<int64_t>(slot.host.nbytes());
}

at::Tensor ActivationSwapPool::fetch(int64_t index) {
  auto it = slots_.find(index);
  if (it == slots_.end()) throw std::logic_error("activation swap: slot " + std::to_string(index) + " was fetched twice");
  if (it->second.device.defined()) {
    ++traffic_.prefetched;
  } else {
    bring_back(it->second);
  }
  at::Tensor out = it->second.device;
  it = slots_.erase(it);
  if (it != slots_.begin()) {  // the layer before runs its backward next
    auto previous = std::prev(it);
    if (!previous->second.device.defined()) bring_back(previous->second);
  }
  return out;
}

void ActivationSwapPool::discard(int64_t index) { slots_.erase(index); }

}  // namespace hyperparallel::models
