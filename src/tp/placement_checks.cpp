// Validation mode's checks. See tp/placement_checks.h for the rules.
#include "hyperparallel/tp/placement_checks.h"

#include <torch/nn/module.h>

#include <optional>

#include "hyperparallel/models/causal_lm.h"
#include "hyperparallel/models/module_interfaces.h"
#include "hyperparallel/nn/forward_hooks.h"
#include "hyperparallel/platform/user_error.h"
#include "models/attention.h"
#include "models/decoder.h"
#include "models/layers.h"

namespace hyperparallel::tp {
namespace {

using dtensor::KnownSizes;
using dtensor::ObservedLayout;
using dtensor::Placement;

KnownSizes for_tensor(const KnownSizes& known, const at::Tensor& t) {
  KnownSizes out;
  for (const auto& [d, size] : known) out[d < 0 ? d + t.dim() : d] = size;
  return out;
}

[[noreturn]] void mismatch(const CheckSite& site, const std::string& role, const std::string& expected,
                           const std::string& actual) {
  throw UserError("placement check failed at '" + site.path + "' (" + site.style + "), op " + site.op + ": " + role +
                  " expected " + expected + ", actual " + actual +
                  ". Fix the tensor-parallel plan (docs/tp.md) so the layout this module receives is the one it computes on");
}

// Replicate, or a shard on any dim but `excluded` (the dim the op reduces over).
bool fits_row_layout(const ObservedLayout& o, const KnownSizes& known, int64_t ndim, int64_t excluded) {
  if (o.fits(dtensor::Replicate(), known)) return true;
  for (int64_t d = 0; d < ndim; ++d) {
    if (d != excluded && o.fits(dtensor::Shard(d), known)) return true;
  }
  return false;
}

// Leaf op rule: the op's input is Replicate or sharded on a row dim (never on the features
// it reduces over, never Partial), unless the weight's spec asks for one exact layout.
class LeafOpCheck : public nn::ForwardHook {
 public:
  LeafOpCheck(CheckSite site, std::optional<Placement> exact_input, int64_t features, std::shared_ptr<TensorParallelContext> ctx)
      : site_(std::move(site)), exact_(exact_input), features_(features), ctx_(std::move(ctx)) {}
  at::Tensor around(const at::Tensor& x, const nn::Forward& next) override {
    const KnownSizes known = features_ > 0 ? KnownSizes{{x.dim() - 1, features_}} : KnownSizes{};
    if (exact_) {
      check_placement(x, *exact_, known, *ctx_, site_, "input");
    } else {
      const ObservedLayout o = dtensor::observe_layout(x, *ctx_->group);
      if (!fits_row_layout(o, known, x.dim(), features_ > 0 ? x.dim() - 1 : -1)) {
        mismatch(site_, "input", features_ > 0 ? "Replicate() or Shard(d) on a dim other than the " + std::to_string(features_) + " features it reduces over"
                                               : "Replicate() or Shard(d)",
                 o.describe(known));
      }
    }
    return next(x);
  }

 private:
  CheckSite site_;
  std::optional<Placement> exact_;
  int64_t features_;
  std::shared_ptr<TensorParallelContext> ctx_;
};

// A residual block: its output joins its input, so both must have one placement.
class ResidualCheck : public nn::ForwardHook {
 public:
  ResidualCheck(CheckSite site, std::shared_ptr<TensorParallelContext> ctx) : site_(std::move(site)), ctx_(std::move(ctx)) {}
  at::Tensor around(const at::Tensor& x, const nn::Forward& next) override {
    const ObservedLayout in = dtensor::observe_layout(x, *ctx_->group);
    std::optional<Placement> layout;
    if (in.fits(dtensor::Replicate(), {})) layout = dtensor::Replicate();
    for (int64_t d = 0; d + 1 < x.dim() && !layout; ++d) {
      if (in.fits(dtensor::Shard(d), {})) layout = dtensor::Shard(d);
    }
    if (!layout) mismatch(site_, "input", "Replicate() or Shard(d) on a dim other than the features", in.describe({}));
    at::Tensor y = next(x);
    const ObservedLayout out = dtensor::observe_layout(y, *ctx_->group);
    if (!out.fits(*layout, {}) || out.shapes != in.shapes) {
      mismatch(site_, "output", layout->to_string() + " as its input, " + in.describe({}) + " (the residual stream's layout)",
               out.describe({}));
    }
    return y;
  }

 private:
  CheckSite site_;
  std::shared_ptr<TensorParallelContext> ctx_;
};

// Attention's body: softmax runs over every key, so the hidden states it projects must be
// whole on every rank (a sequence-parallel input is gathered first, by PrepareModuleInput).
class AttentionBodyCheck : public nn::ForwardHook {
 public:
  AttentionBodyCheck(CheckSite site, int64_t hidden, std::shared_ptr<TensorParallelContext> ctx)
      : site_(std::move(site)), hidden_(hidden), ctx_(std::move(ctx)) {}
  at::Tensor around(const at::Tensor& x, const nn::Forward& next) override {
    const KnownSizes known{{x.dim() - 1, hidden_}};
    const ObservedLayout o = dtensor::observe_layout(x, *ctx_->group);
    if (!o.fits(dtensor::Replicate(), known)) {
      mismatch(site_, "input", "Replicate() with " + std::to_string(hidden_) + " features (softmax runs over every key)",
               o.describe(known));
    }
    return next(x);
  }

 private:
  CheckSite site_;
  int64_t hidden_;
  std::shared_ptr<TensorParallelContext> ctx_;
};

// The q/k/v projections' outputs are viewed as [.., heads, head_dim]: every rank must hold
// whole heads, and each rank's query heads must group evenly over its kv heads (GQA).
struct HeadCounts {
  std::vector<int64_t> query;  // per rank, from the last q_proj output
};

class HeadsViewCheck : public nn::ForwardHook {
 public:
  HeadsViewCheck(CheckSite site, int64_t head_dim, bool query, std::shared_ptr<HeadCounts> counts,
                 std::shared_ptr<TensorParallelContext> ctx)
      : site_(std::move(site)), head_dim_(head_dim), query_(query), counts_(std::move(counts)), ctx_(std::move(ctx)) {}
  at::Tensor around(const at::Tensor& x, const nn::Forward& next) override {
    at::Tensor y = next(x);
    const ObservedLayout o = dtensor::observe_layout(y, *ctx_->group);
    std::vector<int64_t> heads;
    std::string widths;
    bool whole = true;
    for (const auto& shape : o.shapes) {
      const int64_t width = shape.empty() ? 0 : shape.back();
      whole &= width > 0 && width % head_dim_ == 0;
      heads.push_back(width / head_dim_);
      widths += (widths.empty() ? "" : ", ") + std::to_string(width);
    }
    if (!whole) mismatch(site_, "output", "whole heads of " + std::to_string(head_dim_) + " on every rank", "widths " + widths);
    if (query_) {
      counts_->query = heads;
    } else if (counts_->query.size() == heads.size()) {
      for (size_t r = 0; r < heads.size(); ++r) {
        if (counts_->query[r] % heads[r] != 0) {
          mismatch(site_, "output", "a divisor of rank " + std::to_string(r) + "'s " + std::to_string(counts_->query[r]) +
                                        " query heads (each kv head serves a group of them)",
                   std::to_string(heads[r]) + " kv heads on rank " + std::to_string(r));
        }
      }
    }
    return y;
  }

 private:
  CheckSite site_;
  int64_t head_dim_;
  bool query_;
  std::shared_ptr<HeadCounts> counts_;
  std::shared_ptr<TensorParallelContext> ctx_;
};

// The loss: plain cross-entropy takes every vocab logit on every rank; loss parallel's takes
// this rank's vocab shard.
class CrossEntropyCheck : public nn::ForwardHook {
 public:
  CrossEntropyCheck(models::CausalLM& model, std::shared_ptr<TensorParallelContext> ctx) : model_(model), ctx_(std::move(ctx)) {}
  at::Tensor around(const at::Tensor& x, const nn::Forward& next) override {
    at::Tensor logits = next(x);
    const bool sharded = model_.token_loss() && model_.token_loss()->takes_vocab_shards();
    const CheckSite site{"lm_head -> loss", sharded ? "loss parallel" : "not in the plan", "cross-entropy"};
    check_placement(logits, sharded ? dtensor::Shard(-1) : dtensor::Replicate(), {{-1, model_.config().vocab_size}}, *ctx_,
                    site, "logits");
    return logits;
  }

 private:
  models::CausalLM& model_;
  std::shared_ptr<TensorParallelContext> ctx_;
};

std::optional<Placement> layout_of(const ParameterLayouts& layouts, const std::string& name) {
  const auto it = layouts.find(name);
  if (it == layouts.end()) return std::nullopt;
  return it->second.placements().at(0);
}

int64_t weight_width(torch::nn::Module& module) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    if (p.key() == "weight") return p.value().size(-1);
  }
  return -1;
}

}  // namespace

std::string op_of(torch::nn::Module& module) {
  if (dynamic_cast<models::Linear*>(&module)) return "linear";
  if (dynamic_cast<models::Embedding*>(&module)) return "embedding";
  if (dynamic_cast<models::NormModule*>(&module)) return "norm";
  if (dynamic_cast<models::AttentionModule*>(&module) || dynamic_cast<models::FeedForwardModule*>(&module) ||
      dynamic_cast<models::DecoderLayer*>(&module)) {
    return "residual add";
  }
  return module.name();
}

void check_placement(const at::Tensor& local, const Placement& expected, const KnownSizes& known, TensorParallelContext& ctx,
                     const CheckSite& site, const std::string& role) {
  const KnownSizes sizes = for_tensor(known, local);
  const ObservedLayout o = dtensor::observe_layout(local, *ctx.group);
  if (o.fits(expected, sizes)) return;
  std::string want = expected.to_string();
  for (const auto& [d, size] : sizes) want += (want.back() == ')' ? " with " : ", ") + std::string("dim ") + std::to_string(d) + " of " + std::to_string(size);
  mismatch(site, role, want, o.describe(sizes));
}

// The attention-specific rules on models::Attention and its projections.
void attach_attention_checks(models::Attention& attention, const CheckSite& site, std::shared_ptr<TensorParallelContext> ctx) {
  nn::add_forward_hook(attention, std::make_shared<AttentionBodyCheck>(CheckSite{site.path, site.style, "attention"},
                                                                       attention.q_proj->weight.size(1), ctx));
  auto counts = std::make_shared<HeadCounts>();
  for (const auto& [name, proj] : std::vector<std::pair<std::string, models::Linear*>>{
           {"q_proj", attention.q_proj.get()}, {"k_proj", attention.k_proj.get()}, {"v_proj", attention.v_proj.get()}}) {
    const std::string path = site.path + "." + name;
    const auto styled = ctx->styles.find(path);
    const CheckSite view{path, styled == ctx->styles.end() ? "not in the plan" : styled->second, "view as [.., heads, head_dim]"};
    nn::add_forward_hook(*proj, std::make_shared<HeadsViewCheck>(view, attention.head_dim, name == "q_proj", counts, ctx),
                         nn::HookPosition::kOutermost);
  }
}

void attach_placement_checks(torch::nn::Module& root, std::shared_ptr<TensorParallelContext> ctx, const ParameterLayouts& layouts) {
  if (auto* model = dynamic_cast<models::CausalLM*>(&root)) {
    nn::add_forward_hook(root, std::make_shared<CrossEntropyCheck>(*model, ctx), nn::HookPosition::kOutermost);
  }
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    torch::nn::Module& module = *item.value();
    const std::string& path = item.key();
    const auto styled = ctx->styles.find(path);
    const CheckSite site{path, styled == ctx->styles.end() ? "not in the plan" : styled->second, op_of(module)};
    // The experts of a sparse block are outside the plan: their tokens are whichever the
    // router (and, under EP, the tp ranks' split of the shared tokens) sent them.
    if (path.find(".experts.") != std::string::npos) continue;
    if (auto* linear = dynamic_cast<models::Linear*>(&module)) {
      const auto w = layout_of(layouts, path + ".weight");
      const int64_t in_features = linear->weight.size(1) * (w && w->is_shard(1) ? ctx->group->size() : 1);
      std::optional<Placement> exact;
      if (w && w->is_shard(0)) exact = dtensor::Replicate();
      if (w && w->is_shard(1)) exact = dtensor::Shard(-1);
      // A sharded in-features width is the ranks' lengths summed; the check reads it from them.
      nn::add_forward_hook(module, std::make_shared<LeafOpCheck>(site, exact, w && w->is_shard(1) ? -1 : in_features, ctx));
    } else if (dynamic_cast<models::Embedding*>(&module)) {
      // A vocab-parallel embedding's body looks up this rank's local ids; its hook checks that
      // the ids themselves are the same on every rank.
      const auto w = layout_of(layouts, path + ".weight");
      if (!(w && w->is_shard(0))) nn::add_forward_hook(module, std::make_shared<LeafOpCheck>(site, std::nullopt, -1, ctx));
    } else if (dynamic_cast<models::NormModule*>(&module)) {
      nn::add_forward_hook(module, std::make_shared<LeafOpCheck>(site, std::nullopt, weight_width(module), ctx));
    } else if (site.op == "residual add") {
      nn::add_forward_hook(module, std::make_shared<ResidualCheck>(site, ctx), nn::HookPosition::kOutermost);
      if (auto* attention = dynamic_cast<models::Attention*>(&module)) attach_attention_checks(*attention, site, ctx);
    }
  }
}

}  // namespace hyperparallel::tp
