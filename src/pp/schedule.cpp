// The schedules' action lists. See pp/schedule.h.
#include "hyperparallel/pp/schedule.h"

#include <algorithm>
#include <deque>
#include <map>
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

// ZB-H1 by list scheduling in unit time (F = I = W = 1, no communication time): a free rank
// runs, in priority, the next input-gradient pass whose gradient has arrived, else the next
// forward while fewer than ranks - r micro-batches wait for their I (1F1B's order) and fewer
// than `ranks` for their W (a micro-batch's activations stay until its W: 1F1B's peak
// memory, rank 0's), else its oldest deferred weight-gradient pass.
PipelineSchedule zero_bubble(int64_t p, int64_t m) {
  PipelineSchedule s = empty("zero_bubble", p, m, 1);
  std::map<std::pair<int64_t, int64_t>, int64_t> forward_done, input_done;  // (mb, stage) -> finish time
  std::vector<int64_t> next_forward(p, 0), next_input(p, 0), weights_done(p, 0);
  std::vector<std::deque<int64_t>> weights(p);
  const auto done_by = [](const std::map<std::pair<int64_t, int64_t>, int64_t>& m, int64_t mb, int64_t stage, int64_t t) {
    auto it = m.find({mb, stage});
    return it != m.end() && it->second <= t;
  };
  int64_t remaining = 3 * p * m;
  for (int64_t t = 0; remaining > 0; ++t) {
    if (t > 3 * p * m + 3 * p) throw std::logic_error("zero_bubble: the list scheduler made no progress");
    for (int64_t r = 0; r < p; ++r) {
      auto& a = s.per_rank[r];
      const int64_t i = next_input[r], f = next_forward[r];
      const bool input_ready = i < f && done_by(forward_done, i, r, t) && (r == p - 1 || done_by(input_done, i, r + 1, t));
      const bool forward_ready = f < m && f - i < p - r && f - weights_done[r] < p && (r == 0 || done_by(forward_done, f, r - 1, t));
      if (input_ready) {
        a.push_back({ActionKind::kBackwardInput, i, r});
        input_done[{i, r}] = t + 1;
        weights[r].push_back(i);
        ++next_input[r];
      } else if (forward_ready) {
        a.push_back(forward(f, r));
        forward_done[{f, r}] = t + 1;
        ++next_forward[r];
      } else if (!weights[r].empty()) {
        a.push_back({ActionKind::kBackwardWeight, weights[r].front(), r});
        weights[r].pop_front();
        ++weights_done[r];
      } else {
        continue;  // idle this slot
      }
      --remaining;
    }
  }
  return s;
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

PipelineSchedule make_schedule(const std::string& name, int64_t ranks, int64_t microbatches, int64_t virtual_stages) {
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
  if (name == "zero_bubble") return zero_bubble(ranks, microbatches);
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
