// Learning-rate schedules as Hugging Face's get_scheduler defines them, as a pure function of
// the optimizer step (0-based: the rate used by the first step is lr_at(0)). With
// progress = (step - warmup) / (total - warmup):
//   linear                 warmup 0 -> peak, then peak -> 0 at total_steps
//   cosine                 warmup, then peak * 0.5 * (1 + cos(pi * 2 * num_cycles * progress)),
//                          num_cycles 0.5 by default (one half-wave down to 0)
//   cosine_with_min_lr     the cosine factor f rescaled to f * (1 - r) + r, r = min_lr_rate
//                          (or min_lr / peak): it ends at the floor instead of 0
//   cosine_with_restarts   peak * 0.5 * (1 + cos(pi * ((num_cycles * progress) mod 1))),
//                          num_cycles 1 by default; 0 after total_steps
//   polynomial             (peak - lr_end) * (1 - progress)^power + lr_end; lr_end after total
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
  double num_cycles = -1;   // -1: the schedule's default (cosine 0.5, cosine_with_restarts 1)
  double min_lr_rate = 0;   // cosine_with_min_lr
  double lr_end = 1e-7;     // polynomial
  double power = 1.0;       // polynomial

  double lr_at(int64_t step) const;
};

// warmup_steps when > 0, else ceil(warmup_ratio * total_steps), as HF's get_warmup_steps.
int64_t resolve_warmup_steps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps);

struct TrainConfig;  // train/train_config.h
// A run's schedule from its config (lr_scheduler_type, learning_rate, warmup, lr_scheduler_kwargs).
LrSchedule lr_schedule_for(const TrainConfig& config, int64_t total_steps);

}  // namespace hyperparallel::train
