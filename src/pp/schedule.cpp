// The schedules' action lists. See pp/schedule.h.
#include "hyperparallel/pp/schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <utility>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::pp {
namespace {

Action forward(int64_t mb, int64_t stage) { return {ActionKind::kForward, mb, stage}; }
Action backward(int64_t mb, int64_t stage) { return {ActionKind::kBackward, mb, stage}; }

PipelineSchedule empty(const std::string& name, int64_t p, int64_t m, int64_t v) {
  PipelineSchedule s;
  s.name = name;
  s.ranks = p;
  s.microbatches = m;
  s.virtual_stages = v;
  s.per_rank.resize(static_cast<size_t>(p));
  return s;
}

PipelineSchedule gpipe(int64_t p, int64_t m) {
  PipelineSchedule s = empty("gpipe", p, m, 1);
  for (int64_t r = 0; r < p; ++r) {
    for (int64_t i = 0; i < m; ++i) s.per_rank[r].push_back(forward(i, r));
    for (int64_t i = 0; i < m; ++i) s.per_rank[r].push_back(backward(i, r));
  }
  return s;
}

PipelineSchedule one_f_one_b(int64_t p, int64_t m) {
  PipelineSchedule s = empty("1f1b", p, m, 1);
  for (int64_t r = 0; r < p; ++r) {
    const int64_t warmup = std::min(p - r - 1, m);
    auto& a = s.per_rank[r];
    for (int64_t i = 0; i < warmup; ++i) a.push_back(forward(i, r));
    for (int64_t i = 0; i < m - warmup; ++i) {
      a.push_back(forward(warmup + i, r));
      a.push_back(backward(i, r));
    }
    for (int64_t i = m - warmup; i < m; ++i) a.push_back(backward(i, r));
  }
  return s;
}

// Megatron's interleaved order: the k-th forward of a rank is micro-batch
// (k / (p·v))·p + k % p on chunk (k % (p·v)) / p; backwards walk the chunks in reverse.
PipelineSchedule interleaved(int64_t p, int64_t m, int64_t v) {
  PipelineSchedule s = empty("interleaved_1f1b", p, m, v);
  const auto at = [&](int64_t k, bool is_forward, int64_t r) {
    const int64_t in_group = k % (p * v);
    const int64_t chunk = is_forward ? in_group / p : v - 1 - in_group / p;
    const int64_t mb = k / (p * v) * p + k % p;
    return Action{is_forward ? ActionKind::kForward : ActionKind::kBackward, mb, chunk * p + r};
  };
  const int64_t total = m * v;
  for (int64_t r = 0; r < p; ++r) {
    const int64_t warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
    auto& a = s.per_rank[r];
    for (int64_t k = 0; k < warmup; ++k) a.push_back(at(k, true, r));
    for (int64_t i = 0; i < total - warmup; ++i) {
      a.push_back(at(warmup + i, true, r));
      a.push_back(at(i, false, r));
    }
    for (int64_t k = total - warmup; k < total; ++k) a.push_back(at(k, false, r));
  }
  return s;
}

// ZB-H1 by list scheduling with the given costs (unit costs: the paper's F = I = W = 1; no
// communication time): a rank that falls free runs, in priority, the next input-gradient pass
// whose gradient has arrived, else the next forward while fewer than ranks - r micro-batches
// wait for their I (1F1B's order) and fewer than `ranks` for their W (a micro-batch's
// activations stay until its W: 1F1B's peak memory, rank 0's), else its oldest deferred
// weight-gradient pass; with nothing to run it waits for the next action anywhere to finish.
// Real costs matter: with W cheaper than I (a layer's dW GEMMs without the attention core's
// backward) the unit-cost list leaves a rank waiting where the costed one runs a forward.
PipelineSchedule zero_bubble_list(int64_t p, int64_t m, const ActionCosts& costs) {
  PipelineSchedule s = empty("zero_bubble", p, m, 1);
  std::map<std::pair<int64_t, int64_t>, double> forward_done, input_done;  // (mb, stage) -> finish time
  std::vector<int64_t> next_forward(p, 0), next_input(p, 0), weights_done(p, 0);
  std::vector<std::deque<int64_t>> weights(p);
  std::vector<double> free_at(p, 0);
  std::set<double> finishes;  // every scheduled action's finish time
  const auto done_by = [](const std::map<std::pair<int64_t, int64_t>, double>& m, int64_t mb, int64_t stage, double t) {
    auto it = m.find({mb, stage});
    return it != m.end() && it->second <= t;
  };
  std::vector<bool> stalled(p, false);  // waiting, with nothing scheduled to finish later
  const auto schedule_on = [&](int64_t r, Action a, double cost) {
    stalled.assign(p, false);
    s.per_rank[r].push_back(a);
    free_at[r] += cost;
    finishes.insert(free_at[r]);
    return free_at[r];
  };
  for (int64_t remaining = 3 * p * m; remaining > 0;) {
    int64_t r = -1;  // the rank free first (the lowest on ties) among those with work left
    for (int64_t q = 0; q < p; ++q) {
      const bool has_work = next_forward[q] < m || next_input[q] < m || !weights[q].empty();
      if (has_work && !stalled[q] && (r < 0 || free_at[q] < free_at[r])) r = q;
    }
    if (r < 0) throw std::logic_error("zero_bubble: the list scheduler made no progress");
    const double t = free_at[r];
    const int64_t i = next_input[r], f = next_forward[r];
    const bool input_ready = i < f && done_by(forward_done, i, r, t) && (r == p - 1 || done_by(input_done, i, r + 1, t));
    const bool forward_ready = f < m && f - i < p - r && f - weights_done[r] < p && (r == 0 || done_by(forward_done, f, r - 1, t));
    if (input_ready) {
      input_done[{i, r}] = schedule_on(r, {ActionKind::kBackwardInput, i, r}, costs.backward_input);
      weights[r].push_back(i);
      ++next_input[r];
    } else if (forward_ready) {
      forward_done[{f, r}] = schedule_on(r, forward(f, r), costs.forward);
      ++next_forward[r];
    } else if (!weights[r].empty()) {
      schedule_on(r, {ActionKind::kBackwardWeight, weights[r].front(), r}, costs.backward_weight);
      weights[r].pop_front();
      ++weights_done[r];
    } else {
      const auto later = finishes.upper_bound(t);  // wait for the next action anywhere to finish
      if (later != finishes.end()) {
        free_at[r] = *later;
      } else {
        stalled[r] = true;  // until another rank free at t schedules something
      }
      continue;
    }
    --remaining;
  }
  return s;
}

// Greedy list scheduling is a heuristic: at other costs it can lose to the unit-cost list
// (at p = 4 by up to 5 %), so the costed list is taken only where it simulates shorter.
PipelineSchedule zero_bubble(int64_t p, int64_t m, const ActionCosts& costs) {
  PipelineSchedule unit = zero_bubble_list(p, m, ActionCosts{});
  PipelineSchedule fitted = zero_bubble_list(p, m, costs);
  return simulate(fitted, costs).makespan < simulate(unit, costs).makespan ? fitted : unit;
}

char letter(ActionKind k) {
  switch (k) {
    case ActionKind::kForward: return 'F';
    case ActionKind::kBackward: return 'B';
    case ActionKind::kBackwardInput: return 'I';
    default: return 'W';
  }
}

}  // namespace

std::string PipelineSchedule::to_string() const {
  std::string out;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    out += "rank " + std::to_string(r) + ":";
    for (const Action& a : per_rank[r]) {
      out += std::string(" ") + letter(a.kind) + std::to_string(a.microbatch);
      if (virtual_stages > 1) out += "." + std::to_string(a.stage);
    }
    out += "\n";
  }
  return out;
}

PipelineSchedule make_schedule(const std::string& name, int64_t ranks, int64_t microbatches, int64_t virtual_stages,
                               const ActionCosts& costs) {
  if (ranks < 1 || microbatches < 1 || virtual_stages < 1) {
    throw UserError("pipeline schedule " + name + ": ranks, micro-batches and virtual stages must be >= 1 (got " +
                    std::to_string(ranks) + ", " + std::to_string(microbatches) + ", " + std::to_string(virtual_stages) + ")");
  }
  if (name != "interleaved_1f1b" && virtual_stages != 1) {
    throw UserError("pp_virtual_stages " + std::to_string(virtual_stages) + " needs pp_schedule: interleaved_1f1b (" + name +
                    " runs one stage per rank)");
  }
  if (name == "gpipe") return gpipe(ranks, microbatches);
  if (name == "1f1b") return one_f_one_b(ranks, microbatches);
  if (name == "zero_bubble") return zero_bubble(ranks, microbatches, costs);
  if (name == "interleaved_1f1b") {
    if (microbatches % ranks != 0) {
      throw UserError("pp_schedule interleaved_1f1b needs pp_microbatches (" + std::to_string(microbatches) +
                      ") to be a multiple of pp_size (" + std::to_string(ranks) + ")");
    }
    return interleaved(ranks, microbatches, virtual_stages);
  }
  throw UserError("pp_schedule '" + name + "' is not one of: gpipe, 1f1b, interleaved_1f1b, zero_bubble");
}

double one_f_one_b_bubble(int64_t ranks, int64_t microbatches) {
  return static_cast<double>(ranks - 1) / static_cast<double>(microbatches + ranks - 1);
}

}  // namespace hyperparallel::pp
