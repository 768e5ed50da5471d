// Learning-rate schedules. See train/lr_schedule.h.
#include "hyperparallel/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace hyperparallel::train {

double LrSchedule::lr_at(int64_t step) const {
  if (type == "constant") return peak;
  if (step < warmup_steps) return peak * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
  if (type == "constant_with_warmup") return peak;
  const double progress =
      static_cast<double>(step - warmup_steps) / static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  if (type == "cosine") return peak * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
  return peak * std::max(0.0, 1.0 - progress);  // linear
}

int64_t resolve_warmup_steps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps) {
  if (warmup_steps > 0) return warmup_steps;
  return static_cast<int64_t>(std::ceil(warmup_ratio * static_cast<double>(total_steps)));
}

}  // namespace hyperparallel::train
