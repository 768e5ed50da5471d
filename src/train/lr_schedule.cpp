// Learning-rate schedules. See train/lr_schedule.h.
#include "hyperparallel/train/lr_schedule.h"

#include "hyperparallel/train/train_config.h"

#include <algorithm>
#include <cmath>

namespace hyperparallel::train {

double LrSchedule::lr_at(int64_t step) const {
  if (type == "constant") return peak;
  if (step < warmup_steps) return peak * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
  if (type == "constant_with_warmup") return peak;
  const double progress =
      static_cast<double>(step - warmup_steps) / static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  if (type == "cosine" || type == "cosine_with_min_lr") {
    const double cycles = num_cycles > 0 ? num_cycles : 0.5;
    const double factor = 0.5 * (1.0 + std::cos(M_PI * cycles * 2.0 * progress));
    if (type == "cosine") return peak * std::max(0.0, factor);
    return peak * std::max(0.0, factor * (1.0 - min_lr_rate) + min_lr_rate);
  }
  if (type == "cosine_with_restarts") {
    if (progress >= 1.0) return 0.0;
    const double cycles = num_cycles > 0 ? num_cycles : 1.0;
    return peak * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * std::fmod(cycles * progress, 1.0))));
  }
  if (type == "polynomial") {
    if (step > total_steps) return lr_end;
    return (peak - lr_end) * std::pow(1.0 - progress, power) + lr_end;
  }
  return peak * std::max(0.0, 1.0 - progress);  // linear
}

int64_t resolve_warmup_steps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps) {
  if (warmup_steps > 0) return warmup_steps;
  return static_cast<int64_t>(std::ceil(warmup_ratio * static_cast<double>(total_steps)));
}

LrSchedule lr_schedule_for(const TrainConfig& c, int64_t total_steps) {
  LrSchedule s{c.lr_scheduler_type, c.learning_rate, resolve_warmup_steps(c.warmup_steps, c.warmup_ratio, total_steps), total_steps};
  const LrSchedulerKwargs& kw = c.lr_scheduler_kwargs;
  s.num_cycles = kw.num_cycles;
  s.min_lr_rate = kw.min_lr_rate ? *kw.min_lr_rate : kw.min_lr ? *kw.min_lr / c.learning_rate : 0.0;
  s.lr_end = kw.lr_end;
  s.power = kw.power;
  return s;
}

}  // namespace hyperparallel::train
