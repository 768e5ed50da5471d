// Context-parallel degree checks. See cp/cp_options.h.
#include "hyperparallel/cp/cp_options.h"

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::cp {

std::string valid_ulysses_degrees(int64_t heads, int64_t kv_heads, int64_t cp_size) {
  std::string out;
  for (int64_t d = 1; d <= cp_size; ++d) {
    if (cp_size % d == 0 && heads % d == 0 && kv_heads % d == 0) out += (out.empty() ? "" : ", ") + std::to_string(d);
  }
  return out;
}

int64_t resolved_ulysses_degree(const ContextParallelOptions& o, int64_t cp_size) {
  const std::string& a = o.algorithm;
  if (a != "ulysses" && a != "allgather" && a != "ring" && a != "hybrid") {
    throw UserError("cp_algorithm '" + a + "' is not one of: ulysses, allgather, ring, hybrid");
  }
  const int64_t d = o.ulysses_degree;
  if (d < 0 || (d > 0 && cp_size % d != 0)) {
    throw UserError("ulysses_degree " + std::to_string(d) + " does not divide cp_size " + std::to_string(cp_size) +
                    "; use a divisor of it");
  }
  if (a == "ulysses") {
    if (d != 0 && d != cp_size) {
      throw UserError("cp_algorithm ulysses runs over all " + std::to_string(cp_size) + " cp ranks, and ulysses_degree is " +
                      std::to_string(d) + "; use cp_algorithm: hybrid for Ulysses groups inside a ring");
    }
    return cp_size;
  }
  if (a != "hybrid" && d == cp_size && cp_size > 1) {
    throw UserError("ulysses_degree " + std::to_string(d) + " = cp_size makes cp_algorithm " + a +
                    " plain Ulysses; say cp_algorithm: ulysses, or use a smaller degree");
  }
  if (a == "hybrid" && (d <= 1 || d >= cp_size)) {
    throw UserError("cp_algorithm hybrid needs ulysses_degree between 1 and cp_size " + std::to_string(cp_size) +
                    " (exclusive) dividing it; got " + std::to_string(d));
  }
  return d == 0 ? 1 : d;
}

}  // namespace hyperparallel::cp
