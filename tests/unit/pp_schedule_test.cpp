// Pipeline schedules as action lists: each schedule complete and runnable at pp 2 and 4 with
// several micro-batch counts, 1F1B's memory bound, the bubble of GPipe and 1F1B against
// (p-1)/(m+p-1), interleaving and ZB-H1 below it, ZB-H1 lists made with the layers' costs, the
// printed form, and the errors.
#include <gtest/gtest.h>

#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/pp/schedule.h"
#include "hyperparallel/pp/stage_split.h"

namespace hyperparallel {
namespace {

TEST(PipelineSchedules, EveryScheduleIsCompleteAndRuns) {
  for (int64_t p : {2, 4}) {
    for (int64_t m : {p, 2 * p, 3 * p}) {
      for (const std::string name : {"gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"}) {
        SCOPED_TRACE(name + " p " + std::to_string(p) + " m " + std::to_string(m));
        const pp::PipelineSchedule s = pp::make_schedule(name, p, m, name == "interleaved_1f1b" ? 2 : 1);
        EXPECT_NO_THROW(pp::check_schedule(s)) << s.to_string();
      }
    }
  }
  EXPECT_NO_THROW(pp::check_schedule(pp::make_schedule("1f1b", 4, 2)));  // fewer micro-batches than stages
}

TEST(PipelineSchedules, GpipeAnd1f1bHaveTheTheoreticalBubbleAnd1f1bHoldsFewerMicrobatches) {
  for (int64_t p : {2, 4}) {
    for (int64_t m : {p, 2 * p, 4 * p}) {
      const auto gpipe = pp::simulate(pp::make_schedule("gpipe", p, m));
      const auto ofob = pp::simulate(pp::make_schedule("1f1b", p, m));
      EXPECT_NEAR(gpipe.bubble, pp::one_f_one_b_bubble(p, m), 1e-12);
      EXPECT_NEAR(ofob.bubble, pp::one_f_one_b_bubble(p, m), 1e-12);
      for (int64_t r = 0; r < p; ++r) {
        EXPECT_EQ(gpipe.peak_in_flight[r], m);
        EXPECT_EQ(ofob.peak_in_flight[r], std::min(p - r, m));  // at most p micro-batches anywhere
      }
    }
  }
}

// Interleaving with v chunks per rank (each chunk 1/v of a rank's work) and ZB-H1 (B split into
// equal input and weight halves) both leave less idle than 1F1B at the same p and m.
TEST(PipelineSchedules, InterleavingAndZeroBubbleShrinkTheBubble) {
  for (int64_t p : {2, 4}) {
    for (int64_t m : {p, 2 * p, 4 * p}) {
      const double ofob = pp::one_f_one_b_bubble(p, m);
      pp::ActionCosts chunk;
      chunk.forward = 0.5;
      chunk.backward = 1.0;
      const auto interleaved = pp::simulate(pp::make_schedule("interleaved_1f1b", p, m, 2), chunk);
      const auto zero_bubble = pp::simulate(pp::make_schedule("zero_bubble", p, m));
      std::printf("p %lld m %lld: 1f1b %.3f, interleaved (v 2) %.3f, zb-h1 %.3f\n", static_cast<long long>(p),
                  static_cast<long long>(m), ofob, interleaved.bubble, zero_bubble.bubble);
      EXPECT_LT(interleaved.bubble, ofob);
      EXPECT_LT(zero_bubble.bubble, ofob);
      // Theory: interleaving (p-1)/(v·m + p-1) (Megatron); ZB-H1 one slot of idle per stage
      // boundary instead of three, (p-1)/(3m + p-1): reached with every rank holding at most p
      // micro-batches until their W (1F1B's peak) at p = 2 and at m = p; at p = 4, m > p it
      // would take deferring more W's (more memory), and the list schedule stays between.
      EXPECT_NEAR(interleaved.bubble, static_cast<double>(p - 1) / static_cast<double>(2 * m + p - 1), 1e-12);
      const double zb_theory = static_cast<double>(p - 1) / static_cast<double>(3 * m + p - 1);
      if (p == 2 || m == p) {
        EXPECT_NEAR(zero_bubble.bubble, zb_theory, 1e-12);
      } else {
        EXPECT_LT(zero_bubble.bubble, 0.65 * ofob);
        EXPECT_GT(zero_bubble.bubble, zb_theory);
      }
      for (int64_t r = 0; r < p; ++r) EXPECT_LE(zero_bubble.peak_in_flight[r], p);  // until W: 1F1B's peak
    }
  }
}

// Real layers' W is cheaper than their I (no attention-core backward): the list made with those
// costs beats the unit-cost list run at them, holds no more micro-batches and stays valid.
TEST(PipelineSchedules, ZeroBubbleListsFitTheActionsCosts) {
  models::ModelConfig c = models::debug_flavour_config("llama-debug");
  c.hidden_size = 256;
  c.intermediate_size = 768;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 32;
  const pp::ActionCosts costs = pp::layer_costs(c, 256);
  EXPECT_NEAR(costs.backward_input, 1.143, 1e-3);  // (G + 2A) / (G + A), G = 1.573 M, A = 0.262 M FLOPs a token
  EXPECT_NEAR(costs.backward_weight, 0.857, 1e-3);
  EXPECT_DOUBLE_EQ(costs.backward, costs.backward_input + costs.backward_weight);
  EXPECT_GT(pp::layer_costs(c, 4096).backward_input, 1.5);  // long sequences: the attention core dominates
  pp::ActionCosts skewed;
  skewed.backward_input = 1.2;
  skewed.backward_weight = 0.6;
  for (const pp::ActionCosts& at : {costs, skewed}) {
    for (int64_t p : {2, 4}) {
      for (int64_t m : {p, 2 * p, 4 * p}) {
        SCOPED_TRACE("p " + std::to_string(p) + " m " + std::to_string(m) + " I " + std::to_string(at.backward_input));
        const auto fitted = pp::make_schedule("zero_bubble", p, m, 1, at), unit = pp::make_schedule("zero_bubble", p, m);
        pp::check_schedule(fitted);
        const auto fitted_time = pp::simulate(fitted, at), unit_time = pp::simulate(unit, at);
        EXPECT_LE(fitted_time.makespan, unit_time.makespan + 1e-9);  // never worse: the unit list where it is shorter
        for (int64_t r = 0; r < p; ++r) EXPECT_LE(fitted_time.peak_in_flight[r], p);
      }
    }
    const auto p2 = pp::simulate(pp::make_schedule("zero_bubble", 2, 8, 1, at), at);
    const auto p2_unit = pp::simulate(pp::make_schedule("zero_bubble", 2, 8), at);
    std::printf("p 2 m 8, I %.3f W %.3f: fitted list bubble %.3f, unit-cost list %.3f\n", at.backward_input, at.backward_weight,
                p2.bubble, p2_unit.bubble);
    EXPECT_LT(p2.makespan, p2_unit.makespan - 0.2);
  }
}

TEST(PipelineSchedules, ActionListsPrintAsTheyRun) {
  EXPECT_EQ(pp::make_schedule("1f1b", 2, 3).to_string(), "rank 0: F0 F1 B0 F2 B1 B2\nrank 1: F0 B0 F1 B1 F2 B2\n");
  EXPECT_EQ(pp::make_schedule("gpipe", 2, 2).to_string(), "rank 0: F0 F1 B0 B1\nrank 1: F0 F1 B0 B1\n");
  const std::string zb = pp::make_schedule("zero_bubble", 2, 2).to_string();
  EXPECT_NE(zb.find("I0"), std::string::npos);
  EXPECT_NE(zb.find("W0"), std::string::npos);
  EXPECT_NE(pp::make_schedule("interleaved_1f1b", 2, 2, 2).to_string().find("F0.2"), std::string::npos);  // chunk 2 on rank 0
}

TEST(PipelineSchedules, ImpossibleSchedulesAreUserErrors) {
  const auto message = [](const std::string& name, int64_t p, int64_t m, int64_t v) {
    try {
      pp::make_schedule(name, p, m, v);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message("1f2b", 2, 4, 1).find("not one of: gpipe, 1f1b, interleaved_1f1b, zero_bubble"), std::string::npos);
  EXPECT_NE(message("interleaved_1f1b", 4, 6, 2).find("pp_microbatches (6) to be a multiple of pp_size (4)"), std::string::npos);
  EXPECT_NE(message("1f1b", 2, 4, 2).find("needs pp_schedule: interleaved_1f1b"), std::string::npos);
  EXPECT_NE(message("gpipe", 0, 4, 1).find("must be >= 1"), std::string::npos);
  // A hand-made list that waits on itself is found, not run.
  pp::PipelineSchedule bad = pp::make_schedule("1f1b", 2, 2);
  std::swap(bad.per_rank[1][0], bad.per_rank[1][1]);  // rank 1: B0 before F0
  EXPECT_THROW(pp::check_schedule(bad), std::logic_error);
}

}  // namespace
}  // namespace hyperparallel
