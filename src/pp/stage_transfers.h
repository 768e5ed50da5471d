// The point-to-point traffic of one pipeline step on one rank: activations to the next stage,
// gradients to the previous one.
//
// A transfer is named by (micro-batch, receiving stage, direction) and travels with a tag made
// of them, so transfers between the same two ranks (virtual stages) never cross. Receives are
// posted ahead (post) and taken when needed (take); sends are asynchronous and kept alive
// until finish() waits for them at the end of the step. A peer on the same rank (one rank
// holding consecutive stages) hands the tensor over directly. Failures come back as CommError
// naming what was waited for: the micro-batch, the stage and the pp rank it comes from.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hyperparallel/comm/comm_handle.h"
#include "hyperparallel/comm/communicator.h"

namespace hyperparallel::pp {

enum class Direction { kActivation = 0, kGradient = 1 };

struct TransferId {
  int64_t microbatch = 0;
  int64_t stage = 0;  // the receiving stage
  Direction direction = Direction::kActivation;
};

class StageTransfers {
 public:
  StageTransfers(std::shared_ptr<comm::Communicator> group, int64_t stages);

  // Posts the receive of `id` from `src` into a new tensor of `shape` and `dtype` (once).
  void post(const TransferId& id, int src, const std::vector<int64_t>& shape, at::ScalarType dtype);
  // Waits for `id` (posting it first if needed) and returns the tensor.
  at::Tensor take(const TransferId& id, int src, const std::vector<int64_t>& shape, at::ScalarType dtype);
  void send(const TransferId& id, const at::Tensor& tensor, int dst);
  // Waits for every send of the step.
  void finish();

 private:
  struct Pending {
    at::Tensor buffer;
    comm::CommHandle handle;  // completed at once when handed over on this rank
  };
  int tag(const TransferId& id) const;
  std::string describe(const TransferId& id, int peer) const;

  std::shared_ptr<comm::Communicator> group_;
  int64_t stages_;
  std::map<int, Pending> received_;  // by tag
  std::map<int, at::Tensor> local_;  // sent to this rank, by tag
  std::vector<Pending> sent_;
};

}  // namespace hyperparallel::pp
