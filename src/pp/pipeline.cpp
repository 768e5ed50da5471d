// The pipeline runtime. See pp/pipeline.h.
#include "hyperparallel/pp/pipeline.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "hyperparallel/platform/user_error.h"
#include "stage_transfers.h"
#include "weight_pass.h"

namespace hyperparallel::pp {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::string shape_text(at::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// What a (micro-batch, stage) keeps from its forward until its backward is done.
struct InFlight {
  at::Tensor input;  // the received hidden states (a leaf); undefined on the first stage
  models::SpanOutput out;
  at::Tensor root;   // what backward starts from: the scaled loss, or the hidden states sent on
  // Split backward: each segment's output gradients, found by I, and its weight gradients'
  // junctions with what I captured there, both used by W.
  std::vector<std::vector<at::Tensor>> segment_grads;
  std::vector<SegmentWeights> weights;
};

// The tensors with a gradient, and the gradients, as autograd takes them.
void add_root(std::vector<at::Tensor>& roots, std::vector<at::Tensor>& grads, const at::Tensor& root, const at::Tensor& grad) {
  if (!root.defined() || !grad.defined() || !root.requires_grad()) return;
  roots.push_back(root);
  grads.push_back(grad);
}

}  // namespace

class PipelineStage::Step {
 public:
  Step(PipelineStage& stage, const std::vector<models::CausalLMInput>& microbatches, double loss_scale, std::vector<Action> actions)
      : p_(stage), inputs_(microbatches), loss_scale_(loss_scale), transfers_(p_.group_, p_.schedule_.stages()),
        actions_(std::move(actions)) {
    for (size_t i = 0; i < actions_.size(); ++i) {
      if (actions_[i].kind == ActionKind::kBackward || actions_[i].kind == ActionKind::kBackwardWeight) {
        last_weight_backward_[actions_[i].stage] = i;
      }
    }
    const auto params = p_.model_.parameters();
    dtype_ = p_.hooks_.boundary_dtype.value_or(params.empty() ? at::kFloat : params.front().scalar_type());
  }

  PipelineStepResult run() {
    const auto start = Clock::now();
    for (size_t i = 0; i < actions_.size(); ++i) {
      try {
        if (i + 1 < actions_.size()) post_receive(actions_[i + 1]);
        run_action(actions_[i], i);
      } catch (const UserError& e) {
        throw UserError(where(actions_[i]) + e.what());
      } catch (const comm::CommError& e) {
        throw comm::CommError(where(actions_[i]) + e.what());
      } catch (const std::exception& e) {
        throw std::runtime_error(where(actions_[i]) + e.what());
      }
    }
    in_flight_.clear();  // forward-only: nothing waits for a backward
    transfers_.finish();
    result_.step_seconds = seconds_since(start);
    return result_;
  }

 private:
  PipelineStage& p_;
  const std::vector<models::CausalLMInput>& inputs_;
  double loss_scale_;
  StageTransfers transfers_;
  std::vector<Action> actions_;
  std::map<int64_t, size_t> last_weight_backward_;  // stage -> index of its last B or W
  std::map<std::pair<int64_t, int64_t>, InFlight> in_flight_;  // (micro-batch, stage)
  at::ScalarType dtype_;
  PipelineStepResult result_;

  int64_t stages() const { return p_.schedule_.stages(); }
  // "pipeline stage 1 (pp rank 1), B of micro-batch 3: " for a failure inside an action.
  std::string where(const Action& a) const {
    static const char* kNames[] = {"F", "B", "I", "W"};
    return "pipeline stage " + std::to_string(a.stage) + " (pp rank " + std::to_string(p_.group_->rank()) + "), " +
           kNames[static_cast<int>(a.kind)] + " of micro-batch " + std::to_string(a.microbatch) + ": ";
  }
  int rank_of(int64_t stage) const { return static_cast<int>(p_.schedule_.rank_of(stage)); }
  std::vector<int64_t> boundary_shape(int64_t mb) const {
    const models::CausalLMInput& in = inputs_[static_cast<size_t>(mb)];
    if (p_.hooks_.boundary_shape) return p_.hooks_.boundary_shape(in);
    return {in.input_ids.size(0), in.input_ids.size(1), p_.model_.config().hidden_size};
  }

  // The receive an action will wait for, posted while the action before it computes.
  void post_receive(const Action& a) {
    if (a.kind == ActionKind::kForward && a.stage > 0) {
      transfers_.post({a.microbatch, a.stage, Direction::kActivation}, rank_of(a.stage - 1), boundary_shape(a.microbatch), dtype_);
    } else if ((a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput) && a.stage + 1 < stages()) {
      transfers_.post({a.microbatch, a.stage, Direction::kGradient}, rank_of(a.stage + 1), boundary_shape(a.microbatch), dtype_);
    }
  }

  void run_action(const Action& a, size_t index) {
    switch (a.kind) {
      case ActionKind::kForward:
        return forward(a);
      case ActionKind::kBackward:
        return backward(a, index);
      case ActionKind::kBackwardInput:
        return backward_input(a);
      case ActionKind::kBackwardWeight:
        return backward_weight(a, index);
    }
  }

  void forward(const Action& a) {
    InFlight f;
    const models::ModelSpan& span = p_.split_[static_cast<size_t>(a.stage)];
    if (a.stage > 0) {
      f.input = transfers_.take({a.microbatch, a.stage, Direction::kActivation}, rank_of(a.stage - 1), boundary_shape(a.microbatch),
                                dtype_);
      f.input.requires_grad_(at::GradMode::is_enabled());
    }
    const auto start = Clock::now();
    f.out = p_.model_.forward_span(inputs_[static_cast<size_t>(a.microbatch)], f.input, span, p_.schedule_.splits_backward());
    if (span.head) {
      f.root = f.out.lm_loss_sum * loss_scale_;
      result_.lm_loss_sum += f.out.lm_loss_sum.item<double>();
      result_.label_tokens += f.out.label_tokens;
    } else {
      f.root = f.out.hidden;
      const std::vector<int64_t> expected = boundary_shape(a.microbatch);
      if (f.root.sizes() != at::IntArrayRef(expected)) {
        throw std::runtime_error("pipeline stage " + std::to_string(a.stage) + " produced hidden states " + shape_text(f.root.sizes()) +
                                 " for micro-batch " + std::to_string(a.microbatch) + "; the next stage expects " +
                                 shape_text(expected));
      }
      transfers_.send({a.microbatch, a.stage + 1, Direction::kActivation}, f.root.to(dtype_), rank_of(a.stage + 1));
    }
    if (p_.hooks_.after_forward) p_.hooks_.after_forward(a.microbatch, a.stage, f.out);
    result_.busy_seconds += seconds_since(start);
    in_flight_[{a.microbatch, a.stage}] = std::move(f);
    result_.peak_in_flight = std::max(result_.peak_in_flight, static_cast<int64_t>(in_flight_.size()));
  }

  InFlight& held(const Action& a) {
    auto it = in_flight_.find({a.microbatch, a.stage});
    if (it == in_flight_.end()) {
      throw std::logic_error("pipeline: backward of micro-batch " + std::to_string(a.microbatch) + " on stage " +
                             std::to_string(a.stage) + " before its forward");
    }
    return it->second;
  }

  // The gradient of the stage's output: received from the next stage, or 1 for the loss.
  at::Tensor output_gradient(const Action& a, const InFlight& f) {
    if (p_.split_[static_cast<size_t>(a.stage)].head) return at::ones_like(f.root);
    return transfers_.take({a.microbatch, a.stage, Direction::kGradient}, rank_of(a.stage + 1), boundary_shape(a.microbatch), dtype_)
        .to(f.root.scalar_type());
  }

  at::Tensor extra_loss(const Action& a, const InFlight& f) {
    return p_.hooks_.extra_loss ? p_.hooks_.extra_loss(a.microbatch, a.stage, f.out) : at::Tensor();
  }

  void send_input_gradient(const Action& a, const at::Tensor& grad) {
    if (a.stage == 0) return;
    if (!grad.defined()) {
      throw std::logic_error("pipeline stage " + std::to_string(a.stage) + ": no gradient reached its input (micro-batch " +
                             std::to_string(a.microbatch) + ")");
    }
    transfers_.send({a.microbatch, a.stage - 1, Direction::kGradient}, grad.to(dtype_), rank_of(a.stage - 1));
  }

  void backward(const Action& a, size_t index) {
    InFlight& f = held(a);
    const at::Tensor grad = output_gradient(a, f);
    const auto start = Clock::now();
    std::vector<at::Tensor> roots, grads;
    add_root(roots, grads, f.root, grad);
    const at::Tensor extra = extra_loss(a, f);
    if (extra.defined()) add_root(roots, grads, extra, at::ones_like(extra));
    if (p_.hooks_.before_weight_backward) p_.hooks_.before_weight_backward(a.stage, last_weight_backward_[a.stage] == index);
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    result_.busy_seconds += seconds_since(start);
    send_input_gradient(a, f.input.defined() ? f.input.grad() : at::Tensor());
    in_flight_.erase({a.microbatch, a.stage});
  }

  // I: each segment's input gradient from its outputs' gradients, last segment first; the
  // graphs stay for W.
  void backward_input(const Action& a) {
    InFlight& f = held(a);
    std::vector<models::SpanSegment>& segments = f.out.segments;
    const at::Tensor grad = output_gradient(a, f);
    const auto start = Clock::now();
    f.segment_grads.assign(segments.size(), {});
    for (size_t k = 0; k < segments.size(); ++k) f.segment_grads[k].resize(segments[k].outputs.size());
    // The stage's output (the last segment's first output; the loss is scaled into the root).
    f.segment_grads.back()[0] = p_.split_[static_cast<size_t>(a.stage)].head ? grad * loss_scale_ : grad;
    if (p_.hooks_.before_input_backward) p_.hooks_.before_input_backward(a.stage);
    add_extra_loss_gradients(a, f);
    f.weights.clear();
    for (const auto& segment : segments) f.weights.emplace_back(segment.outputs, segment.input, segment.params);
    at::Tensor input_grad;
    for (size_t k = segments.size(); k-- > 0;) {
      std::vector<at::Tensor> roots, grads;
      for (size_t o = 0; o < segments[k].outputs.size(); ++o) add_root(roots, grads, segments[k].outputs[o], f.segment_grads[k][o]);
      if (!segments[k].input.defined() || roots.empty()) continue;
      input_grad = torch::autograd::grad(roots, {segments[k].input}, grads, /*retain_graph=*/true, false, /*allow_unused=*/true)[0];
      if (k > 0) f.segment_grads[k - 1][0] = input_grad;
    }
    for (auto& w : f.weights) w.stop_capture();
    result_.busy_seconds += seconds_since(start);
    send_input_gradient(a, input_grad);
  }

  // The extra term (MoE's load balancing) reaches the segments through their router logits.
  void add_extra_loss_gradients(const Action& a, InFlight& f) {
    const at::Tensor extra = extra_loss(a, f);
    if (!extra.defined() || !extra.requires_grad()) return;
    std::vector<at::Tensor> targets;
    std::vector<std::pair<size_t, size_t>> where;
    for (size_t k = 0; k < f.out.segments.size(); ++k) {
      for (size_t o = 1; o < f.out.segments[k].outputs.size(); ++o) {
        targets.push_back(f.out.segments[k].outputs[o]);
        where.emplace_back(k, o);
      }
    }
    if (targets.empty()) return;
    const auto grads = torch::autograd::grad({extra}, targets, {at::ones_like(extra)}, /*retain_graph=*/true, false, /*allow_unused=*/true);
    for (size_t i = 0; i < grads.size(); ++i) f.segment_grads[where[i].first][where[i].second] = grads[i];
  }

  // W: each segment's weight gradients from what I captured at their junctions, last segment
  // first, its gradient hooks fired first (FSDP unshards there), all in one backward.
  void backward_weight(const Action& a, size_t index) {
    InFlight& f = held(a);
    const auto start = Clock::now();
    if (p_.hooks_.before_weight_backward) p_.hooks_.before_weight_backward(a.stage, last_weight_backward_[a.stage] == index);
    run_as_one_backward([&] {
      for (size_t k = f.out.segments.size(); k-- > 0;) {
        f.weights[k].accumulate(f.segment_grads[k]);
        result_.weight_groups_direct += f.weights[k].direct_groups();
        result_.weight_groups_replayed += f.weights[k].replayed_groups();
      }
    });
    result_.busy_seconds += seconds_since(start);
    in_flight_.erase({a.microbatch, a.stage});
  }
};

PipelineStage::PipelineStage(models::CausalLM& model, std::vector<models::ModelSpan> split, PipelineSchedule schedule,
                             std::shared_ptr<comm::Communicator> group, PipelineHooks hooks)
    : model_(model), split_(std::move(split)), schedule_(std::move(schedule)), group_(std::move(group)), hooks_(std::move(hooks)) {
  if (static_cast<int64_t>(split_.size()) != schedule_.stages()) {
    throw UserError("pipeline: the split has " + std::to_string(split_.size()) + " stages and the schedule " +
                    std::to_string(schedule_.stages()) + " (pp_size x pp_virtual_stages)");
  }
  if (group_->size() != schedule_.ranks) {
    throw UserError("pipeline: the schedule is for " + std::to_string(schedule_.ranks) + " ranks and the pipeline group has " +
                    std::to_string(group_->size()));
  }
  check_schedule(schedule_);
}

PipelineStage::~PipelineStage() = default;

PipelineStepResult PipelineStage::run(const std::vector<models::CausalLMInput>& microbatches, double loss_scale) {
  if (static_cast<int64_t>(microbatches.size()) != schedule_.microbatches) {
    throw UserError("pipeline: " + std::to_string(microbatches.size()) + " micro-batches given to a schedule of " +
                    std::to_string(schedule_.microbatches) + " (pp_microbatches)");
  }
  Step step(*this, microbatches, loss_scale, schedule_.per_rank[static_cast<size_t>(group_->rank())]);
  return step.run();
}

PipelineStepResult PipelineStage::evaluate(const std::vector<models::CausalLMInput>& microbatches) {
  // Each micro-batch through this rank's stages in model order: a topological order of the
  // forwards on every rank, so blocking on each input cannot deadlock.
  std::vector<Action> actions;
  for (int64_t m = 0; m < static_cast<int64_t>(microbatches.size()); ++m) {
    for (int64_t s = group_->rank(); s < schedule_.stages(); s += schedule_.ranks) actions.push_back({ActionKind::kForward, m, s});
  }
  at::NoGradGuard no_grad;
  Step step(*this, microbatches, 1.0, std::move(actions));
  return step.run();
}

}  // namespace hyperparallel::pp
