// The options of context parallelism and the checks on them that need no model or tensors
// (the trainer's config validation uses them too). See cp/context_parallel.h.
#pragma once

#include <cstdint>
#include <string>

namespace hyperparallel::cp {

struct ContextParallelOptions {
  std::string algorithm = "ring";  // ulysses | allgather | ring | hybrid
  // Ranks of one Ulysses group: 0 = the algorithm's own (cp for ulysses, 1 for allgather and
  // ring); hybrid needs 1 < degree < cp dividing cp.
  int64_t ulysses_degree = 0;
  // Ranks that already split each layer's heads (tensor parallelism): Ulysses divides the
  // heads / head_split this rank holds.
  int64_t head_split = 1;
};

// The Ulysses degree `options` resolves to over `cp_size` ranks (UserError when invalid).
int64_t resolved_ulysses_degree(const ContextParallelOptions& options, int64_t cp_size);

// Ulysses degrees that fit `cp_size` and divide both head counts, for messages: "1, 2".
std::string valid_ulysses_degrees(int64_t heads, int64_t kv_heads, int64_t cp_size);

}  // namespace hyperparallel::cp
