// Learning-rate schedules as Hugging Face's get_scheduler defines them, as a pure function of
// the optimizer step (0-based: the rate used by the first step is lr_at(0)).
//   linear                 warmup 0 -> peak, then peak -> 0 at total_steps
//   cosine                 warmup, then peak * 0.5 * (1 + cos(pi * progress))
//   constant               peak throughout (no warmup, as HF)
//   constant_with_warmup   warmup, then peak
// Warmup is linear from 0: peak * step / warmup_steps.
#pragma once

#include <cstdint>
#include <string>

namespace hyperparallel::train {

struct LrSchedule {
  std::string type = "linear";
  double peak = 5e-5;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  double lr_at(int64_t step) const;
};

// warmup_steps when > 0, else ceil(warmup_ratio * total_steps), as HF's get_warmup_steps.
int64_t resolve_warmup_steps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps);

}  // namespace hyperparallel::train
