// Ring attention (cp/context_parallel.h): each rank's K/V block travels around the ring while
// every rank folds the blocks it holds into an online softmax over its own queries; backward
// runs the ring again with each block's dK/dV accumulating on its way back to its owner.
//
// Forward, step s of n: rank r holds the block of rank (r - s) mod n, sends it on to r + 1 and
// receives the next from r - 1 while it computes (the transfer overlaps the block's compute).
// Only (query chunk, key chunk) pairs at or below the causal diagonal are computed. Saved for
// backward: q, k, v, the output and the log-sum-exp per query row (fp32). Backward, step s:
// the K/V block moves as in forward; this rank's dK/dV contribution to the block it holds is
// added to the partial sum that arrives from r - 1 (received while computing) and sent on,
// so after n steps every block's gradient is home. Bytes per rank and layer: forward
// (n-1)·|K,V|, backward (n-1)·|K,V| + n·|dK,dV| (fp32 on the wire).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/models/module_interfaces.h"

namespace hyperparallel::cp {

struct RingLayout {
  std::vector<std::vector<int64_t>> starts;  // per ring rank: the first index of each of its chunks
  int64_t chunk = 0;                         // tokens per chunk
};

// q [B, H, T, D], k, v [B, H_kv, T, D]: this rank's tokens (chunks layout.starts[ring.rank()]).
// Returns [B, H, T, D] in q's dtype.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RingLayout& layout,
                          std::shared_ptr<comm::Communicator> ring, const models::SequenceShard& shard, double scaling);

}  // namespace hyperparallel::cp
