// The tensor-parallel styles: parameter partitioning and boundary hooks. See
// parallel_styles.h for what each style does and docs/tp.md for the gradients.
#include "hyperparallel/tp/parallel_styles.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <optional>

#include "hyperparallel/dtensor/functional_collectives.h"
#include "hyperparallel/nn/forward_hooks.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/tp/placement_checks.h"
#include "models/layers.h"

namespace hyperparallel::tp {

using dtensor::GradIs;
using dtensor::KnownSizes;
using dtensor::Placement;

TensorParallelContext::TensorParallelContext(mesh::DeviceMesh tp_mesh)
    : mesh(std::move(tp_mesh)), group(mesh.comm(mesh.axis_names().at(0))) {}

int64_t TensorParallelContext::global_size(const at::Tensor& local, int64_t dim) const {
  const auto it = sharded_dim_sizes.find(dim);
  if (it != sharded_dim_sizes.end() && !pipeline_stage) return it->second;
  // Not sharded by a hook here (an input that arrives sharded): the ranks' lengths summed. The
  // same on every rank, since every rank runs the same hooks in the same order.
  at::Tensor total = at::full({1}, local.size(dim), at::kLong);
  group->all_reduce(total).wait();
  return total.item<int64_t>();
}

namespace {

int64_t normalized_dim(const Placement& p, const at::Tensor& x) { return p.dim() < 0 ? p.dim() + x.dim() : p.dim(); }

// A boundary's declared layout, checked in Validation mode (tp/placement_checks.h).
void check_declared(const at::Tensor& t, const Placement& declared, const KnownSizes& known, TensorParallelContext& ctx,
                    const CheckSite& site, const char* role) {
  if (ctx.validate_placement) check_placement(t, declared, known, ctx, site, role);
}

KnownSizes features(int64_t width) { return width > 0 ? KnownSizes{{-1, width}} : KnownSizes{}; }

// The feature widths a boundary hook's input and output have, where the module tells them:
// a norm's (its weight's) and an embedding's output; -1 (not checked) for blocks.
struct Widths {
  int64_t in = -1, out = -1;
};
Widths boundary_widths(torch::nn::Module& module) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    if (p.key() != "weight") continue;
    if (dynamic_cast<models::Embedding*>(&module)) return {-1, p.value().size(-1)};
    if (dynamic_cast<models::NormModule*>(&module)) return {p.value().size(-1), p.value().size(-1)};
  }
  return {};
}

// Moves a boundary tensor from one tp layout to another. A gathered result's gradient is
// `gathered_grad` (kPartial when sharded work consumes it).
at::Tensor to_layout(const at::Tensor& x, const Placement& from, const Placement& to, TensorParallelContext& ctx,
                     GradIs gathered_grad) {
  comm::Communicator& group = *ctx.group;
  if (from.is_shard() && to.is_replicate()) {
    const int64_t d = normalized_dim(from, x);
    return dtensor::all_gather_into(x, d, group, {ctx.global_size(x, d), gathered_grad});
  }
  if (from.is_replicate() && to.is_shard()) {
    const int64_t d = normalized_dim(to, x);
    ctx.sharded_dim_sizes[d] = x.size(d);
    return dtensor::local_shard(x, d, group);
  }
  if (from.is_partial() && to.is_replicate()) return dtensor::all_reduce(x, group, from.reduce_op());
  if (from.is_partial() && to.is_shard()) {
    const int64_t d = normalized_dim(to, x);
    ctx.sharded_dim_sizes[d] = x.size(d);
    return dtensor::reduce_scatter(x, d, group, from.reduce_op());
  }
  if (from == to || (from.is_shard() && to.is_shard() && normalized_dim(from, x) == normalized_dim(to, x))) return x;
  throw UserError("tensor parallel: no boundary move from " + from.to_string() + " to " + to.to_string());
}

template <typename T>
T& module_as(torch::nn::Module& module, const std::string& path, const std::string& style, const char* kind) {
  auto* typed = dynamic_cast<T*>(&module);
  if (!typed) {
    throw UserError("tensor parallel plan: " + style + " applies to " + kind + " modules, but '" + path + "' is a " +
                    module.name());
  }
  return *typed;
}

void check_layout(const Placement& p, const std::string& path, const std::string& style, const char* role,
                  bool allow_partial = false) {
  if (p.is_partial() && !allow_partial) {
    throw UserError("tensor parallel plan: " + style + " on '" + path + "': " + role + " " + p.to_string() +
                    " is not supported; use Replicate() or Shard(d)");
  }
}

// Keeps this rank's shard of `param` on `dim` (in place) and records its layout.
void shard_parameter(at::Tensor& param, int64_t dim, const std::string& name, const TensorParallelContext& ctx,
                     ParameterLayouts& layouts) {
  const int64_t n = ctx.group->size(), me = ctx.group->rank(), size = param.size(dim);
  const std::vector<int64_t> global = param.sizes().vec();
  at::NoGradGuard no_grad;
  param.set_data(param.narrow(dim, dtensor::shard_offset(size, n, me), dtensor::shard_length(size, n, me)).clone());
  layouts.emplace(name, dtensor::DTensorSpec(ctx.mesh, {dtensor::Shard(dim)}, global));
}

void record_replicated(torch::nn::Module& module, const std::string& path, const TensorParallelContext& ctx,
                       ParameterLayouts& layouts) {
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const std::string name = path + "." + item.key();
    if (!layouts.count(name)) layouts.emplace(name, dtensor::DTensorSpec(ctx.mesh, {dtensor::Replicate()}, item.value().sizes().vec()));
  }
}

// ---- hooks ------------------------------------------------------------------------------

class ColwiseHook : public nn::ForwardHook {
 public:
  // `out_features`: the whole output width, for gathering a Replicate output.
  ColwiseHook(ColwiseParallel style, CheckSite site, int64_t in_features, int64_t out_features,
              std::shared_ptr<TensorParallelContext> ctx)
      : style_(style), site_(std::move(site)), in_features_(in_features), out_features_(out_features), ctx_(std::move(ctx)) {}
  at::Tensor around(const at::Tensor& x, const nn::Forward& next) override {
    check_declared(x, style_.input_layout, features(in_features_), *ctx_, site_, "input");
    at::Tensor in = x;
    if (style_.input_layout.is_shard()) {
      in = to_layout(x, style_.input_layout, dtensor::Replicate(), *ctx_, GradIs::kPartial);
    } else if (style_.reduce_input_grad) {
      in = dtensor::reduce_grad(x, *ctx_->group);
    }
    at::Tensor y = next(in);
    if (style_.output_layout.is_replicate()) {
      y = dtensor::all_gather_into(y, y.dim() - 1, *ctx_->group, {out_features_, GradIs::kReplicate});
    }
    check_declared(y, style_.output_layout, features(out_features_), *ctx_, site_, "output");
    return y;
  }

 private:
  ColwiseParallel style_;
  CheckSite site_;
  int64_t in_features_, out_features_;
  std::shared_ptr<TensorParallelContext> ctx_;
};

// The partial output is reduced before the bias is added, once: the hook takes the bias out
// of the Linear's own forward for the duration of the call.
class RowwiseLinearHook : public nn::ForwardHook {
 public:
  RowwiseLinearHook(RowwiseParallel style, CheckSite site, int64_t in_features, models::Linear& linear,
                    std::shared_ptr<TensorParallelContext> ctx)
      : style_(style), site_(std::move(site)), in_features_(in_features), linear_(linear), ctx_(std::move(ctx)) {}
  at::Tensor around(const at::Tensor& x, const nn::Forward& next) override {
    check_declared(x, style_.input_layout, features(in_features_), *ctx_, site_, "input");
    const at::Tensor in = to_layout(x, style_.input_layout, dtensor::Shard(-1), *ctx_, GradIs::kPartial);
    const at::Tensor bias = linear_.bias;
    linear_.bias = at::Tensor();
    at::Tensor partial;
    try {
      partial = next(in);
    } catch (...) {
      linear_.bias = bias;
      throw;
    }
    linear_.bias = bias;
    at::Tensor y = to_layout(partial, dtensor::Partial(), style_.output_layout, *ctx_, GradIs::kReplicate);
    // On a sharded output each rank adds the bias to its part only: its gradient is a sum over tp.
    if (bias.defined()) y = y + (style_.output_layout.is_shard() ? dtensor::reduce_grad(bias, *ctx_->group) : bias);
    check_declared(y, style_.output_layout, features(linear_.weight.size(0)), *ctx_, site_, "output");
    return y;
  }

 private:
  RowwiseParallel style_;
  CheckSite site_;
  int64_t in_features_;
  models::Linear& linear_;
  std::shared_ptr<TensorParallelContext> ctx_;
};

// Vocab-parallel embedding: ids outside this rank's rows look up row 0 and are zeroed, so
// the sum over tp holds exactly one non-zero term per token.
class VocabParallelHook : public nn::ForwardHook {
 public:
  VocabParallelHook(RowwiseParallel style, CheckSite site, const at::Tensor& weight, int64_t first, int64_t rows,
                    std::shared_ptr<TensorParallelContext> ctx)
      : style_(style), site_(std::move(site)), weight_(weight), first_(first), rows_(rows), ctx_(std::move(ctx)) {}
  at::Tensor around(const at::Tensor& ids, const nn::Forward& next) override {
    check_declared(ids, dtensor::Replicate(), {}, *ctx_, site_, "input ids");
    at::Tensor partial;
    if (rows_ == 0) {  // an empty shard (vocab < tp ranks): nothing to look up
      std::vector<int64_t> shape = ids.sizes().vec();
      shape.push_back(weight_.size(1));
      // Zeros that stay in the autograd graph (through the empty weight), so this rank's
      // backward runs the same collectives as its peers'.
      partial = at::zeros(shape, weight_.options()) + weight_.sum() * 0.0;
    } else {
      const at::Tensor mine = ids.ge(first_).logical_and(ids.lt(first_ + rows_));
      const at::Tensor local_ids = at::where(mine, ids - first_, at::zeros_like(ids));
      partial = next(local_ids) * mine.unsqueeze(-1);
    }
    at::Tensor y = to_layout(partial, dtensor::Partial(), style_.output_layout, *ctx_, GradIs::kReplicate);
    check_declared(y, style_.output_layout, features(weight_.size(1)), *ctx_, site_, "output");
    return y;
  }

 private:
  RowwiseParallel style_;
  CheckSite site_;
  at::Tensor weight_;  // the module's parameter (identity kept): its dtype and width
  int64_t first_, rows_;
  std::shared_ptr<TensorParallelContext> ctx_;
};

// Input moved to the style's layout, output moved to the next module's.
struct OutputMove {
  Placement from, to;
};

class BoundaryHook : public nn::ForwardHook {
 public:
  // `sharded_work`: the module's computation is split over tp, so its input's gradient is a
  // sum over ranks (a gathered input's dual is a reduce-scatter, a replicated one is reduced
  // when `reduce_replicated_input_grad`); otherwise every rank computes the same. No `out`:
  // the style leaves the module's output as the module makes it (PrepareModuleInput).
  BoundaryHook(CheckSite site, Widths widths, Placement in_from, Placement in_to, std::optional<OutputMove> out,
               std::shared_ptr<TensorParallelContext> ctx, bool reduce_replicated_input_grad, bool sharded_work = true)
      : site_(std::move(site)), widths_(widths), in_from_(in_from), in_to_(in_to), out_(out), ctx_(std::move(ctx)),
        reduce_input_grad_(reduce_replicated_input_grad), sharded_work_(sharded_work) {}
  at::Tensor around(const at::Tensor& x, const nn::Forward& next) override {
    check_declared(x, in_from_, features(widths_.in), *ctx_, site_, "input");
    at::Tensor in = to_layout(x, in_from_, in_to_, *ctx_, sharded_work_ ? GradIs::kPartial : GradIs::kReplicate);
    if (reduce_input_grad_ && in_from_.is_replicate() && in_to_.is_replicate()) in = dtensor::reduce_grad(in, *ctx_->group);
    if (!out_) return next(in);
    at::Tensor y = to_layout(next(in), out_->from, out_->to, *ctx_, GradIs::kReplicate);
    check_declared(y, out_->to, features(widths_.out), *ctx_, site_, "output");
    return y;
  }

 private:
  CheckSite site_;
  Widths widths_;
  Placement in_from_, in_to_;
  std::optional<OutputMove> out_;
  std::shared_ptr<TensorParallelContext> ctx_;
  bool reduce_input_grad_, sharded_work_;
};

class OutputHook : public nn::ForwardHook {
 public:
  OutputHook(PrepareModuleOutput style, CheckSite site, std::shared_ptr<TensorParallelContext> ctx)
      : style_(style), site_(std::move(site)), ctx_(std::move(ctx)) {}
  at::Tensor around(const at::Tensor& x, const nn::Forward& next) override {
    const GradIs grad = style_.reduce_output_grad ? GradIs::kPartial : GradIs::kReplicate;
    const at::Tensor out = next(x);
    check_declared(out, style_.output_layout, {}, *ctx_, site_, "output");
    at::Tensor y = to_layout(out, style_.output_layout, style_.desired_output_layout, *ctx_, grad);
    const bool replicated = style_.output_layout.is_replicate() && style_.desired_output_layout.is_replicate();
    return replicated && style_.reduce_output_grad ? dtensor::reduce_grad(y, *ctx_->group) : y;
  }

 private:
  PrepareModuleOutput style_;
  CheckSite site_;
  std::shared_ptr<TensorParallelContext> ctx_;
};

class KvHeadHook : public nn::ForwardHook {
 public:
  KvHeadHook(int64_t first, int64_t width) : first_(first), width_(width) {}
  at::Tensor around(const at::Tensor& x, const nn::Forward& next) override { return next(x).narrow(-1, first_, width_); }

 private:
  int64_t first_, width_;
};

void sum_gradients_over_tp(torch::nn::Module& module, const TensorParallelContext& ctx) {
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    at::Tensor param = item.value();
    param.register_hook([group = ctx.group](const at::Tensor& grad) {
      at::Tensor summed = grad.contiguous().clone();
      group->all_reduce(summed).wait();
      return summed;
    });
  }
}

}  // namespace

void ColwiseParallel::apply(torch::nn::Module& module, const std::string& path, std::shared_ptr<TensorParallelContext> ctx,
                            ParameterLayouts& layouts) const {
  auto& linear = module_as<models::Linear>(module, path, name(), "Linear");
  check_layout(input_layout, path, name(), "input layout");
  if (!(output_layout.is_replicate() || output_layout == dtensor::Shard(-1))) {
    throw UserError("tensor parallel plan: ColwiseParallel on '" + path + "': output layout " + output_layout.to_string() +
                    " is not supported; use Shard(-1) (local features) or Replicate()");
  }
  auto hook = std::make_shared<ColwiseHook>(*this, CheckSite{path, name(), "linear"}, linear.weight.size(1), linear.weight.size(0), ctx);
  shard_parameter(linear.weight, 0, path + ".weight", *ctx, layouts);
  if (linear.bias.defined()) shard_parameter(linear.bias, 0, path + ".bias", *ctx, layouts);
  nn::add_forward_hook(module, std::move(hook));
}

void RowwiseParallel::apply(torch::nn::Module& module, const std::string& path, std::shared_ptr<TensorParallelContext> ctx,
                            ParameterLayouts& layouts) const {
  check_layout(output_layout, path, name(), "output layout", /*allow_partial=*/true);
  if (auto* embedding = dynamic_cast<models::Embedding*>(&module)) {
    const int64_t vocab = embedding->weight.size(0), n = ctx->group->size(), me = ctx->group->rank();
    shard_parameter(embedding->weight, 0, path + ".weight", *ctx, layouts);
    nn::add_forward_hook(module, std::make_shared<VocabParallelHook>(*this, CheckSite{path, name(), "embedding"}, embedding->weight,
                                                                      dtensor::shard_offset(vocab, n, me),
                                                                      dtensor::shard_length(vocab, n, me), ctx));
    return;
  }
  auto& linear = module_as<models::Linear>(module, path, name(), "Linear or Embedding");
  check_layout(input_layout, path, name(), "input layout");
  const int64_t in_features = linear.weight.size(1);
  shard_parameter(linear.weight, 1, path + ".weight", *ctx, layouts);
  record_replicated(module, path, *ctx, layouts);
  nn::add_forward_hook(module, std::make_shared<RowwiseLinearHook>(*this, CheckSite{path, name(), "linear"}, in_features, linear, ctx));
}

void SequenceParallel::apply(torch::nn::Module& module, const std::string& path, std::shared_ptr<TensorParallelContext> ctx,
                             ParameterLayouts& layouts) const {
  check_layout(input_layout, path, name(), "input layout");
  check_layout(output_layout, path, name(), "output layout");
  // The replicated weights see only this rank's part of the input: their gradient is one
  // term of a sum over tp.
  sum_gradients_over_tp(module, *ctx);
  record_replicated(module, path, *ctx, layouts);
  const Placement sharded = dtensor::Shard(sequence_dim);
  nn::add_forward_hook(module, std::make_shared<BoundaryHook>(CheckSite{path, name(), op_of(module)}, boundary_widths(module),
                                                               input_layout, sharded, OutputMove{sharded, output_layout}, ctx, false));
}

void PrepareModuleInput::apply(torch::nn::Module& module, const std::string& path, std::shared_ptr<TensorParallelContext> ctx,
                               ParameterLayouts& layouts) const {
  check_layout(input_layout, path, name(), "input layout");
  check_layout(desired_input_layout, path, name(), "desired input layout");
  nn::add_forward_hook(module, std::make_shared<BoundaryHook>(CheckSite{path, name(), op_of(module)}, Widths{}, input_layout,
                                                               desired_input_layout, std::nullopt, ctx, true));
}

void PrepareModuleOutput::apply(torch::nn::Module& module, const std::string& path, std::shared_ptr<TensorParallelContext> ctx,
                                ParameterLayouts& layouts) const {
  check_layout(output_layout, path, name(), "output layout");
  check_layout(desired_output_layout, path, name(), "desired output layout");
  nn::add_forward_hook(module, std::make_shared<OutputHook>(*this, CheckSite{path, name(), op_of(module)}, ctx));
}

void ReplicatedKvHeads::apply(torch::nn::Module& module, const std::string& path, std::shared_ptr<TensorParallelContext> ctx,
                              ParameterLayouts& layouts) const {
  module_as<models::Linear>(module, path, name(), "Linear");
  const int64_t n = ctx->group->size();
  if (num_kv_heads <= 0 || num_heads % n != 0 || n % num_kv_heads != 0) {
    throw UserError("tensor parallel plan: ReplicatedKvHeads on '" + path + "' needs tp (" + std::to_string(n) +
                    ") to divide the " + std::to_string(num_heads) + " attention heads and be a multiple of the " +
                    std::to_string(num_kv_heads) + " kv heads");
  }
  const int64_t heads_per_rank = num_heads / n, groups = num_heads / num_kv_heads;
  const int64_t kv_head = ctx->group->rank() * heads_per_rank / groups;
  sum_gradients_over_tp(module, *ctx);
  record_replicated(module, path, *ctx, layouts);
  nn::add_forward_hook(module, std::make_shared<KvHeadHook>(kv_head * head_dim, head_dim));
}

void NoParallel::apply(torch::nn::Module& module, const std::string& path, std::shared_ptr<TensorParallelContext> ctx,
                       ParameterLayouts& layouts) const {
  check_layout(input_layout, path, name(), "input layout");
  check_layout(output_layout, path, name(), "output layout");
  record_replicated(module, path, *ctx, layouts);
  nn::add_forward_hook(module, std::make_shared<BoundaryHook>(CheckSite{path, name(), op_of(module)}, boundary_widths(module),
                                                               input_layout, dtensor::Replicate(), OutputMove{dtensor::Replicate(), output_layout}, ctx, false,
                                                               /*sharded_work=*/false));
}

}  // namespace hyperparallel::tp
