// Simulating and checking action lists. See pp/schedule.h.
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>

#include "hyperparallel/pp/schedule.h"

namespace hyperparallel::pp {
namespace {

using Key = std::tuple<ActionKind, int64_t, int64_t>;  // kind, micro-batch, stage

std::string describe(const Action& a) {
  const char* kinds[] = {"forward", "backward", "input-gradient", "weight-gradient"};
  return std::string(kinds[static_cast<int>(a.kind)]) + " of micro-batch " + std::to_string(a.microbatch) + " on stage " +
         std::to_string(a.stage);
}

// The actions `a` waits for (on any rank).
std::vector<Key> dependencies(const PipelineSchedule& s, const Action& a) {
  const int64_t last = s.stages() - 1;
  const bool split = s.splits_backward();
  const ActionKind grad = split ? ActionKind::kBackwardInput : ActionKind::kBackward;
  switch (a.kind) {
    case ActionKind::kForward:
      return a.stage == 0 ? std::vector<Key>{} : std::vector<Key>{{ActionKind::kForward, a.microbatch, a.stage - 1}};
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput: {
      std::vector<Key> d{{ActionKind::kForward, a.microbatch, a.stage}};
      if (a.stage < last) d.emplace_back(grad, a.microbatch, a.stage + 1);
      return d;
    }
    default:
      return {{ActionKind::kBackwardInput, a.microbatch, a.stage}};
  }
}

double cost(const ActionCosts& c, ActionKind k) {
  switch (k) {
    case ActionKind::kForward: return c.forward;
    case ActionKind::kBackward: return c.backward;
    case ActionKind::kBackwardInput: return c.backward_input;
    default: return c.backward_weight;
  }
}

}  // namespace

ScheduleTiming simulate(const PipelineSchedule& s, const ActionCosts& costs) {
  std::map<Key, double> finished;
  std::vector<size_t> next(s.per_rank.size(), 0);
  std::vector<double> free_at(s.per_rank.size(), 0);
  ScheduleTiming timing;
  timing.peak_in_flight.assign(s.per_rank.size(), 0);
  std::vector<int64_t> in_flight(s.per_rank.size(), 0);
  double busy = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t r = 0; r < s.per_rank.size(); ++r) {
      while (next[r] < s.per_rank[r].size()) {
        const Action& a = s.per_rank[r][next[r]];
        double start = free_at[r];
        bool ready = true;
        for (const Key& d : dependencies(s, a)) {
          auto it = finished.find(d);
          if (it == finished.end()) {
            ready = false;
            break;
          }
          start = std::max(start, it->second);
        }
        if (!ready) break;
        free_at[r] = start + cost(costs, a.kind);
        busy += cost(costs, a.kind);
        finished[{a.kind, a.microbatch, a.stage}] = free_at[r];
        if (a.kind == ActionKind::kForward) {
          timing.peak_in_flight[r] = std::max(timing.peak_in_flight[r], ++in_flight[r]);
        } else if (a.kind != ActionKind::kBackwardInput) {
          --in_flight[r];  // held until B, or with the split backward until W
        }
        ++next[r];
        progress = true;
      }
    }
  }
  for (size_t r = 0; r < s.per_rank.size(); ++r) {
    if (next[r] < s.per_rank[r].size()) {
      throw std::logic_error(s.name + ": rank " + std::to_string(r) + " can never run its " + describe(s.per_rank[r][next[r]]) +
                             " (a deadlock)");
    }
    timing.makespan = std::max(timing.makespan, free_at[r]);
  }
  timing.bubble = timing.makespan > 0 ? 1 - busy / (static_cast<double>(s.ranks) * timing.makespan) : 0;
  return timing;
}

void check_schedule(const PipelineSchedule& s) {
  std::set<Key> seen;
  for (size_t r = 0; r < s.per_rank.size(); ++r) {
    for (const Action& a : s.per_rank[r]) {
      if (s.rank_of(a.stage) != static_cast<int64_t>(r) || a.stage >= s.stages() || a.microbatch >= s.microbatches) {
        throw std::logic_error(s.name + ": rank " + std::to_string(r) + " lists the " + describe(a) + ", which is not its own");
      }
      if (!seen.insert({a.kind, a.microbatch, a.stage}).second) {
        throw std::logic_error(s.name + ": the " + describe(a) + " is listed twice");
      }
    }
  }
  const size_t kinds = s.splits_backward() ? 3 : 2;
  const size_t expected = kinds * static_cast<size_t>(s.microbatches * s.stages());
  if (seen.size() != expected) {
    throw std::logic_error(s.name + ": " + std::to_string(seen.size()) + " actions listed, " + std::to_string(expected) +
                           " expected (every micro-batch forward and backward on every stage)");
  }
  simulate(s);  // throws on a deadlock; dependencies include each forward before its backward
}

}  // namespace hyperparallel::pp
