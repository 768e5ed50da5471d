// Pipeline schedules as plain action lists: which forward or backward of which micro-batch on
// which stage each rank runs, in order. The pipeline runtime executes a rank's list as given;
// tests and docs print, check and simulate them.
//
// Stages are numbered 0..S-1 along the model (S = ranks x virtual_stages); stage s lives on rank
// s % ranks (interleaving: rank r holds stages r, r + ranks, ...). Dependencies: F(m, s) needs
// F(m, s-1); B(m, s) needs B(m, s+1) and F(m, s) (the last stage's B needs only its F). A
// zero-bubble schedule splits B into I (the input gradient, what the previous stage waits for)
// and W (the weight gradient, needed by nobody but the optimizer): I(m, s) needs I(m, s+1) and
// F(m, s); W(m, s) needs I(m, s).
//
//   gpipe             every forward, then every backward
//   1f1b              (PipeDream-flush) ranks - r - 1 warm-up forwards, then one forward and one
//                     backward in turn, then the remaining backwards: at most ranks - r
//                     micro-batches' activations held on rank r
//   interleaved_1f1b  Megatron's, over virtual_stages chunks per rank (micro-batches a multiple
//                     of ranks): a smaller bubble, (ranks-1)/(v·m) instead of (ranks-1)/m
//   zero_bubble       ZB-H1 (Qi et al., 2023): 1F1B's order, each W deferred into the slots
//                     where the rank would otherwise wait, at most `ranks` micro-batches held
//                     until their W on any rank (1F1B's peak); list-scheduled with the
//                     actions' costs
//
// simulate() runs a schedule with given costs and zero communication time and reports the
// makespan and bubble (idle share); check_schedule() verifies completeness, order and that the
// lists cannot deadlock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hyperparallel::pp {

enum class ActionKind { kForward, kBackward, kBackwardInput, kBackwardWeight };

struct Action {
  ActionKind kind = ActionKind::kForward;
  int64_t microbatch = 0;
  int64_t stage = 0;
  bool operator==(const Action& o) const { return kind == o.kind && microbatch == o.microbatch && stage == o.stage; }
};

struct PipelineSchedule {
  std::string name;
  int64_t ranks = 1, microbatches = 1, virtual_stages = 1;
  std::vector<std::vector<Action>> per_rank;  // each rank's actions, in order

  int64_t stages() const { return ranks * virtual_stages; }
  int64_t rank_of(int64_t stage) const { return stage % ranks; }
  bool splits_backward() const { return name == "zero_bubble"; }
  // One line per rank: "rank 0: F0 F1 B0 ..." (stage suffix ".s" with virtual stages; I/W for
  // the split backward).
  std::string to_string() const;
};

struct ActionCosts {
  double forward = 1, backward = 2;             // a full backward
  double backward_input = 1, backward_weight = 1;  // its halves, for the split schedule
};

// UserError for an unknown name, degrees < 1, or interleaving whose micro-batches are not a
// multiple of the ranks (or virtual_stages != 1 for the others). `costs` shape zero_bubble's
// list (the others are fixed orders): unit costs give the paper's ZB-H1 list; a model's
// estimate (pp::layer_costs, stage_split.h) fits W's real share.
PipelineSchedule make_schedule(const std::string& name, int64_t ranks, int64_t microbatches, int64_t virtual_stages = 1,
                               const ActionCosts& costs = {});

struct ScheduleTiming {
  double makespan = 0;
  double bubble = 0;                 // 1 - busy time / (ranks x makespan)
  std::vector<int64_t> peak_in_flight;  // per rank: the most micro-batch stages forwarded and not yet through B (or W)
};

// Throws std::logic_error naming the first action that could never run (a deadlock).
ScheduleTiming simulate(const PipelineSchedule& schedule, const ActionCosts& costs = {});

// Every (micro-batch, stage) forwarded and backpropagated exactly once on its stage's rank, in
// a dependency order that can run; std::logic_error otherwise.
void check_schedule(const PipelineSchedule& schedule);

// The bubble fraction (p-1)/(m+p-1) of GPipe and 1F1B with backward = 2 x forward.
double one_f_one_b_bubble(int64_t ranks, int64_t microbatches);

}  // namespace hyperparallel::pp
