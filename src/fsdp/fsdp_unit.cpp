#include "fsdp_unit.h"

#include <algorithm>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include "fsdp_root.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::fsdp {
namespace {


// Calls back when a parameter's gradient has been accumulated.
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(std::weak_ptr<FSDPUnit> unit, std::function<void()> on_ready)
      : unit_(std::move(unit)), on_ready_(std::move(on_ready)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (!unit_.expired()) on_ready_();
    return outputs;
  }

 private:
  std::weak_ptr<FSDPUnit> unit_;
  std::function<void()> on_ready_;
};

}  // namespace

at::Tensor ShardedParam::view_of(const at::Tensor& flat, int64_t offset, int64_t rows) const {
  if (shape.empty()) return rows == 1 ? alias_of(flat, offset, {}) : alias_of(flat, offset, {rows});  // a scalar
  // Row-major over the shard-dim-first shape, then the shard dim swapped back into place.
  std::vector<int64_t> moved = shape;
  std::swap(moved[0], moved[shard_dim]);
  moved[0] = rows;
  const auto contiguous = c10::contiguous_strides(moved);
  std::vector<int64_t> strides(contiguous.begin(), contiguous.end());
  std::swap(moved[0], moved[shard_dim]);
  std::swap(strides[0], strides[shard_dim]);
  return alias_of(flat, offset, moved, strides);
}

at::Tensor ShardedParam::rows_of(const at::Tensor& t) const {
  const at::Tensor moved = shard_dim == 0 ? t : t.transpose(0, shard_dim);
  return moved.contiguous().reshape({-1, row_numel});
}

const char* to_string(TrainingState state) {
  switch (state) {
    case TrainingState::kIdle: return "IDLE";
    case TrainingState::kForward: return "FORWARD";
    case TrainingState::kPreBackward: return "PRE_BACKWARD";
    case TrainingState::kPostBackward: return "POST_BACKWARD";
  }
  return "?";
}

const char* to_string(UnitState state) {
  switch (state) {
    case UnitState::kSharded: return "SHARDED";
    case UnitState::kUnsharded: return "UNSHARDED";
    case UnitState::kShardedPostForward: return "SHARDED_POST_FORWARD";
  }
  return "?";
}

// ---- construction ------------------------------------------------------------------------

FSDPUnit::FSDPUnit(std::vector<torch::nn::Module*> modules, std::vector<Param> params, NamedTensors replicated,
                   std::shared_ptr<comm::Communicator> shard_comm, std::shared_ptr<comm::Communicator> replicate_comm,
                   std::shared_ptr<comm::Communicator> dp_comm, const FullyShardOptions& options)
    : mesh_(*options.mesh),
      modules_(std::move(modules)),
      shard_comm_(std::move(shard_comm)),
      replicate_comm_(std::move(replicate_comm)),
      dp_comm_(std::move(dp_comm)),
      replicated_(std::move(replicated)) {
  if (std::holds_alternative<bool>(options.reshard_after_forward)) {
    settings_.reshard_after_forward = std::get<bool>(options.reshard_after_forward);
  } else {
    const int k = std::get<int>(options.reshard_after_forward);
    const int n_ranks = shard_comm_->size();
    if (k < 2 || k >= n_ranks || n_ranks % k != 0) {
      throw UserError("fully_shard: reshard_after_forward = " + std::to_string(k) + " must divide the shard group size " +
                      std::to_string(n_ranks) + " and lie in [2, " + std::to_string(n_ranks) +
                      "); use true or false otherwise");
    }
    settings_.reshard_after_forward = true;
    settings_.post_forward_group = k;
    // Groups of k consecutive ranks of the shard group; every member creates its own.
    const int first = shard_comm_->rank() / k * k;
    std::vector<int> members(shard_comm_->global_ranks().begin() + first, shard_comm_->global_ranks().begin() + first + k);
    post_forward_comm_ = shard_comm_->group(members, shard_comm_->name() + "_post_forward");
  }
  settings_.comm_fusion = options.comm_fusion;
  settings_.forward_prefetch_depth = options.forward_prefetch_depth;
  settings_.backward_prefetch_depth = options.backward_prefetch_depth;
  mp_ = options.mp_policy;
  param_dtype_ = mp_.param_dtype.value_or(at::kFloat);
  reduce_dtype_ = mp_.reduce_dtype.value_or(param_dtype_);
  for (auto dtype : {param_dtype_, reduce_dtype_}) {
    if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) {
      throw UserError(std::string("fully_shard: mixed precision dtype ") + c10::toString(dtype) +
                      " is not one of Float, BFloat16, Half");
    }
  }
  const int64_t n = shard_comm_->size(), me = shard_comm_->rank();
  int64_t shard_total = 0;
  for (auto& [name, p, module_index] : params) {
    if (p.scalar_type() != at::kFloat) {
      throw UserError("fully_shard: parameter " + name + " is " + std::string(c10::toString(p.scalar_type())) +
                      "; parameters must be fp32 masters (mixed precision is not supported yet)");
    }
    ShardedParam sp;
    sp.name = name;
    sp.module_index = module_index;
    sp.param = p;
    sp.shape = p.sizes().vec();
    if (options.shard_placement_fn) {
      if (auto dim = options.shard_placement_fn(name, p)) sp.shard_dim = *dim < 0 ? *dim + p.dim() : *dim;
    }
    if (sp.shard_dim < 0 || (sp.shard_dim > 0 && sp.shard_dim >= p.dim())) {
      throw UserError("fully_shard: shard_placement_fn chose dim " + std::to_string(sp.shard_dim) + " for " + name +
                      ", which has " + std::to_string(p.dim()) + " dims");
    }
    sp.dim0 = p.dim() == 0 ? 1 : p.size(sp.shard_dim);
    sp.row_numel = sp.dim0 == 0 ? 0 : p.numel() / sp.dim0;
    const int64_t rows_per_rank = (sp.dim0 + n - 1) / n;
    sp.block = rows_per_rank * sp.row_numel;
    sp.local_rows = std::max<int64_t>(0, std::min(sp.dim0, (me + 1) * rows_per_rank) - me * rows_per_rank);
    sp.shard_offset = shard_total;
    sp.unsharded_offset = shard_total * n;
    shard_total += sp.block;
    blocks_.push_back(sp.block);
    if (p.requires_grad()) ++grads_needed_;
    params_.push_back(std::move(sp));
  }
  sharded_ = at::zeros({shard_total});
  offload_ = options.offload_policy.cpu_offload;
  if (param_dtype_ != at::kFloat || offload_) device_shard_ = at::zeros({shard_total}, at::TensorOptions().dtype(param_dtype_));
  // One rank holding every row, nothing replicated, fp32 on the host: the shards are the full
  // parameters, so no all-gather buffer is ever allocated (the world of one of a single-process
  // run pays nothing for being a unit).
  local_ = n == 1 && !replicate_comm_ && param_dtype_ == at::kFloat && reduce_dtype_ == at::kFloat && !offload_;
  unsharded_ = ReleasableBuffer(shard_total * n, param_dtype_);
  unsharded_grad_ = ReleasableBuffer(shard_total * n, param_dtype_);
  if (reduce_dtype_ != param_dtype_) reduce_input_ = ReleasableBuffer(shard_total * n, reduce_dtype_);
  if (settings_.post_forward_group > 0) {
    const int64_t per_member = n / settings_.post_forward_group;
    post_forward_ = ReleasableBuffer(shard_total * per_member, param_dtype_);
    for (int64_t b : blocks_) post_forward_blocks_.push_back(b * per_member);
  }
  for (const auto& [name, p] : replicated_) {
    if (p.requires_grad()) ++grads_needed_;
  }
  grad_accumulators_.resize(params_.size() + replicated_.size());
  // Padding rows stay zero in every buffer: never visible, and they reduce to zero.
  for (size_t i = 0; i < params_.size(); ++i) load_full(i, params_[i].param.detach());
  point_params_at_sharded();
}

void FSDPUnit::join_root(std::shared_ptr<FSDPRoot> root, bool is_root) {
  root_ = std::move(root);
  is_root_ = is_root;
}

void FSDPUnit::set_trace(std::shared_ptr<platform::TraceRecorder> trace) {
  for (const auto& comm : {shard_comm_, replicate_comm_, dp_comm_, post_forward_comm_}) {
    if (comm) comm->set_trace(trace);
  }
  trace_ = std::move(trace);
}

std::vector<FSDPUnit*> FSDPUnit::units_below() {
  std::vector<FSDPUnit*> units;
  units.push_back(this);
  for (torch::nn::Module* module : modules_) {
    for (const auto& item : module->named_modules()) {
      auto* unit = dynamic_cast<FSDPUnit*>(find_hooks(*item.value()));
      if (unit && std::find(units.begin(), units.end(), unit) == units.end()) units.push_back(unit);
    }
  }
  return units;
}

std::vector<at::Tensor> FSDPUnit::gather_full_masters() {
  const int64_t n = shard_comm_->size();
  at::Tensor full = at::empty({sharded_.numel() * n});
  shard_comm_->all_gather_blocks(full, sharded_, blocks_).wait();
  std::vector<at::Tensor> out;
  for (const auto& sp : params_) out.push_back(sp.view_of(full, sp.unsharded_offset, sp.dim0).contiguous());
  return out;
}

ShardedTensor FSDPUnit::local_shard(size_t i) const {
  const ShardedParam& sp = params_[i];
  ShardedTensor t;
  t.local = sp.view_of(sharded_, sp.shard_offset, sp.local_rows).contiguous();
  t.shard_dim = sp.shard_dim;
  t.global_shape = sp.shape;
  t.row_offset = first_row(i);
  return t;
}

int64_t FSDPUnit::first_row(size_t i) const {
  const ShardedParam& sp = params_[i];
  return sp.row_numel ? shard_comm_->rank() * (sp.block / sp.row_numel) : 0;
}

void FSDPUnit::load_local_rows(size_t i, const at::Tensor& rows) {
  const ShardedParam& sp = params_[i];
  at::NoGradGuard no_grad;
  sharded_.narrow(0, sp.shard_offset, sp.local_rows * sp.row_numel).copy_(sp.rows_of(rows).reshape({-1}));
}

void FSDPUnit::load_full(size_t i, const at::Tensor& full) {
  const ShardedParam& sp = params_[i];
  if (sp.local_rows == 0) return;
  const at::Tensor rows = sp.rows_of(full).narrow(0, first_row(i), sp.local_rows);
  sharded_.narrow(0, sp.shard_offset, sp.local_rows * sp.row_numel).copy_(rows.reshape({-1}));
}

// ---- state machine -----------------------------------------------------------------------

void FSDPUnit::transition(UnitState from, UnitState to) {
  if (state_ != from) {
    throw std::logic_error(std::string("FSDP unit ") + modules_.front()->name() + ": transition " + to_string(from) + " -> " +
                           to_string(to) + " from state " + to_string(state_));
  }
  state_ = to;
}

void FSDPUnit::point_params_at_sharded() {
  for (auto& sp : params_) {
    sp.param.set_data(sp.view_of(sharded_, sp.shard_offset, sp.local_rows));
    if (sp.param.requires_grad() && !accumulating_ && sharded_grad_.defined()) {
      sp.param.mutable_grad() = sp.view_of(sharded_grad_, sp.shard_offset, sp.local_rows);
    }
  }
}

void FSDPUnit::ensure_grad_buffers() {
  if (!sharded_grad_.defined()) sharded_grad_ = at::zeros({sharded_.numel()});
  if (grad_path_ == GradPath::kReduceThenAdd && !reduced_.defined()) {
    reduced_ = at::zeros({sharded_.numel()}, at::TensorOptions().dtype(reduce_dtype_));
  }
}

// Chosen when a backward starts a new accumulation (docs/fsdp.md "Buffers"). The shard
// gradients hold nothing worth keeping when every parameter's gradient was set to none since
// the last step (LibTorch 2.x's zero_grad): the reduction may then write straight into them.
FSDPUnit::GradPath FSDPUnit::choose_grad_path() const {
  bool fresh = true;
  for (const auto& sp : params_) {
    if (sp.param.requires_grad() && sp.param.grad().defined()) fresh = false;
  }
  // In place, a scaling factor would also scale what earlier steps left there.
  if (local_ && (fresh || !settings_.gradient_scaling_factor)) return GradPath::kAccumulateInShards;
  if (fresh && reduce_dtype_ == at::kFloat && !offload_) return GradPath::kReduceIntoShards;
  return GradPath::kReduceThenAdd;
}

const at::Tensor& FSDPUnit::full_params() const { return local_ ? sharded_ : unsharded_.tensor(); }

const at::Tensor& FSDPUnit::full_grads() const {
  return grad_path_ == GradPath::kAccumulateInShards ? sharded_grad_ : unsharded_grad_.tensor();
}

const at::Tensor& FSDPUnit::reduction_output() const {
  return grad_path_ == GradPath::kReduceThenAdd ? reduced_ : sharded_grad_;
}

void FSDPUnit::place_masters(at::Tensor storage, std::function<void(const at::Tensor&)> release) {
  if (state_ != UnitState::kSharded || training_state_ != TrainingState::kIdle || !pending_gather_.empty()) {
    throw std::logic_error("FSDP unit " + label_ + ": master shards move only while sharded and idle");
  }
  storage.copy_(sharded_);
  sharded_ = std::move(storage);
  device_shard_version_ = -1;  // cast again from the new buffer
  release_masters_ = std::move(release);
  point_params_at_sharded();
}

WarmMemoryPool* FSDPUnit::pool() const { return root_ ? root_->pool() : nullptr; }

void FSDPUnit::release_unsharded() {
  for (auto& sp : params_) sp.param.set_data(sp.view_of(sharded_, sp.shard_offset, sp.local_rows));
  unsharded_.release(pool());
  if (root_ && !local_) root_->unsharded_released(this);
}

// Bumped by every in-place write to the shards (optimizer steps write the parameters, loads
// the flat buffer).
int64_t FSDPUnit::shard_version() const {
  int64_t v = static_cast<int64_t>(sharded_._version());
  for (const auto& sp : params_) v += static_cast<int64_t>(sp.param._version());
  return v;
}

void FSDPUnit::drop_pending_gather() {
  if (pending_gather_.empty()) return;
  for (auto& h : pending_gather_) h.wait();  // the peers take part in it: finish it, then drop it
  pending_gather_.clear();
  unsharded_.release(pool());
  if (root_) root_->unsharded_released(this);
}

void FSDPUnit::unshard_async() {
  if (state_ == UnitState::kUnsharded || !pending_gather_.empty() || local_) return;
  gather_version_ = shard_version();
  unsharded_.acquire(pool());
  if (root_) root_->unsharded_acquired(this);
  if (state_ == UnitState::kShardedPostForward) {  // within the group of k
    pending_gather_.push_back(post_forward_comm_->all_gather_blocks(unsharded_.tensor(), post_forward_.tensor(), post_forward_blocks_));
    return;
  }
  // Mixed precision: the all-gather moves param_dtype, cast from the fp32 masters when they
  // changed since the last cast (so between optimizer steps nothing reads them).
  // Offload: the host shard is staged on the compute device every time.
  if (device_shard_.defined() && (offload_ || device_shard_version_ != shard_version())) {
    device_shard_.copy_(sharded_);
    device_shard_version_ = shard_version();
    if (release_masters_) release_masters_(sharded_);
  }
  const at::Tensor& source = device_shard_.defined() ? device_shard_ : sharded_;
  if (settings_.comm_fusion) {
    pending_gather_.push_back(shard_comm_->all_gather_blocks(unsharded_.tensor(), source, blocks_));
    return;
  }
  for (const auto& sp : params_) {  // one collective per parameter: the unfused path
    pending_gather_.push_back(shard_comm_->all_gather(unsharded_.tensor().narrow(0, sp.unsharded_offset, sp.block * shard_comm_->size()),
                                                      source.narrow(0, sp.shard_offset, sp.block)));
  }
}

void FSDPUnit::issue_unshard() {
  if (state_ == UnitState::kUnsharded) return;
  // An unshard() issued before the shards changed and never waited for: its result is stale.
  // Every rank stepped its optimizer (SPMD), so every rank re-issues the gather alike.
  if (!pending_gather_.empty() && gather_version_ != shard_version()) drop_pending_gather();
  unshard_async();
}

void FSDPUnit::unshard() {
  if (state_ == UnitState::kUnsharded) return;
  issue_unshard();
  for (auto& h : pending_gather_) h.wait();
  pending_gather_.clear();
  for (auto& sp : params_) sp.param.set_data(sp.view_of(full_params(), sp.unsharded_offset, sp.dim0));
  if (state_ == UnitState::kShardedPostForward) {
    post_forward_.release(pool());
    transition(UnitState::kShardedPostForward, UnitState::kUnsharded);
    return;
  }
  transition(UnitState::kSharded, UnitState::kUnsharded);
}

void FSDPUnit::reshard_post_forward() {
  // Keep this rank's k-group share of the full parameters, then release the rest.
  const int64_t j = shard_comm_->rank() % settings_.post_forward_group;
  post_forward_.acquire(pool());
  int64_t out = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t piece = post_forward_blocks_[i];
    post_forward_.tensor().narrow(0, out, piece).copy_(unsharded_.tensor().narrow(0, params_[i].unsharded_offset + j * piece, piece));
    out += piece;
  }
  release_unsharded();
  transition(UnitState::kUnsharded, UnitState::kShardedPostForward);
}

void FSDPUnit::reshard() {
  drop_pending_gather();
  if (state_ == UnitState::kSharded) return;
  if (state_ == UnitState::kShardedPostForward) {
    post_forward_.release(pool());
    transition(UnitState::kShardedPostForward, UnitState::kSharded);
    return;
  }
  release_unsharded();
  transition(UnitState::kUnsharded, UnitState::kSharded);
}

// ---- forward -----------------------------------------------------------------------------

void FSDPUnit::enter(std::initializer_list<TrainingState> from, TrainingState to) {
  if (std::find(from.begin(), from.end(), training_state_) == from.end()) {
    throw std::logic_error(std::string("FSDP unit ") + label_ + ": " + to_string(to) + " from training state " +
                           to_string(training_state_));
  }
  training_state_ = to;
}

void FSDPUnit::pre_forward() {
  enter({TrainingState::kIdle, TrainingState::kForward}, TrainingState::kForward);
  forward_started_ = platform::TraceRecorder::Clock::now();
  // A forward during backward is activation recompute of a segment holding this unit: its
  // parameters are gathered for it and kept for the backward that follows at once; nothing is
  // prefetched and the forward order stays as recorded.
  recomputing_ = root_ && root_->in_backward();
  if (recomputing_) {
    unshard();
    register_grad_hooks();
    return;
  }
  if (!root_) {
    // The first unit to run forward is the root; it adopts every unit below it.
    auto units = units_below();
    auto root = std::make_shared<FSDPRoot>(units);
    for (FSDPUnit* unit : units) unit->join_root(root, unit == this);
    for (const auto& item : modules_.front()->named_modules()) {
      auto* unit = dynamic_cast<FSDPUnit*>(find_hooks(*item.value()));
      if (unit && unit->label_.empty()) unit->label_ = item.key().empty() ? "root" : item.key();
    }
  }
  // This unit's gather and the next units' prefetches are all in flight before it waits for
  // its own (the root's forward had waited for its own before issuing the first block's).
  issue_unshard();
  root_->on_pre_forward(this);
  unshard();
  register_grad_hooks();
}

void FSDPUnit::register_grad_hooks() {
  // Accumulators are made while the parameters have their full shape and compute dtype:
  // autograd checks gradients against the accumulator's metadata.
  std::weak_ptr<FSDPUnit> self = weak_from_this();
  for (size_t i = 0; i < grad_accumulators_.size(); ++i) {
    const at::Tensor& p = i < params_.size() ? params_[i].param : replicated_[i - params_.size()].second;
    if (!p.requires_grad()) continue;
    auto acc = torch::autograd::impl::grad_accumulator(p);
    if (acc == grad_accumulators_[i]) continue;
    acc->add_post_hook(std::make_unique<GradReadyHook>(self, [this, i] { on_grad_ready(i); }));
    grad_accumulators_[i] = std::move(acc);
  }
}

at::Tensor FSDPUnit::cast_input(at::Tensor input) {
  if (!mp_.cast_forward_inputs || param_dtype_ == at::kFloat || !input.is_floating_point()) return input;
  return input.to(param_dtype_);
}

at::Tensor FSDPUnit::post_forward(at::Tensor output) {
  // A unit over a list of modules keeps its parameters until the last of them has run.
  const bool last = ++forwards_done_ >= modules_.size();
  if (last) {
    forwards_done_ = 0;
    enter({TrainingState::kForward}, TrainingState::kIdle);
  }
  if (last && !is_root_ && settings_.reshard_after_forward && !recomputing_) {
    if (settings_.post_forward_group > 0) {
      reshard_post_forward();
    } else {
      reshard();
    }
  }
  if (mp_.output_dtype && output.is_floating_point()) output = output.to(*mp_.output_dtype);
  if (output.requires_grad()) {
    std::weak_ptr<FSDPUnit> self = weak_from_this();
    output.register_hook([self](const at::Tensor&) {
      if (auto unit = self.lock()) unit->pre_backward();
    });
  }
  if (trace_) trace_->span("forward " + label_, "compute", forward_started_, platform::TraceRecorder::Clock::now());
  return output;
}

// ---- backward ----------------------------------------------------------------------------

void FSDPUnit::pre_backward() {
  if (training_state_ == TrainingState::kPreBackward || training_state_ == TrainingState::kPostBackward) {
    return;  // an output used twice fires twice
  }
  enter({TrainingState::kIdle}, TrainingState::kPreBackward);
  forwards_done_ = 0;
  backward_started_ = platform::TraceRecorder::Clock::now();
  unshard();
  root_->on_pre_backward(this);
  if (!accumulating_) {
    grad_path_ = choose_grad_path();
    if (grad_path_ == GradPath::kAccumulateInShards) {
      ensure_grad_buffers();
    } else {
      unsharded_grad_.acquire(root_->pool());
      unsharded_grad_.tensor().zero_();
    }
  }
  for (auto& sp : params_) {
    sp.grad_ready = false;
    if (!sp.param.requires_grad()) continue;
    // A gradient set to none since the last step (LibTorch 2.x's zero_grad) means zero where
    // backward adds into sharded_grad_ (kReduceIntoShards overwrites all of it).
    if (!accumulating_ && grad_path_ != GradPath::kReduceIntoShards && sharded_grad_.defined() && !sp.param.grad().defined()) {
      sp.view_of(sharded_grad_, sp.shard_offset, sp.local_rows).zero_();
    }
    sp.param.mutable_grad() = sp.view_of(full_grads(), sp.unsharded_offset, sp.dim0);
  }
  grads_ready_ = 0;
}

void FSDPUnit::on_grad_ready(size_t index) {
  if (training_state_ != TrainingState::kPreBackward) return;
  if (index < params_.size()) {
    if (params_[index].grad_ready) return;
    params_[index].grad_ready = true;
  }
  if (++grads_ready_ < grads_needed_) return;
  enter({TrainingState::kPreBackward}, TrainingState::kPostBackward);
  if (trace_) trace_->span("backward " + label_, "compute", backward_started_, platform::TraceRecorder::Clock::now());
  if (settings_.requires_gradient_sync) issue_reduce_scatter();
  // Its gradients are complete, so no later backward step reads its parameters.
  if (!is_root_ && (settings_.requires_gradient_sync || settings_.reshard_after_backward)) reshard();
}

void FSDPUnit::issue_reduce_scatter() {
  reduce_issued_ = true;
  // Replicated parameters: a DDP-style all-reduce of each gradient over every dp rank.
  for (const auto& [name, p] : replicated_) {
    if (p.requires_grad() && p.grad().defined()) pending_replicated_.push_back(dp_comm_->all_reduce(p.grad(), settings_.reduce_op));
  }
  if (grad_path_ == GradPath::kAccumulateInShards) return;  // backward wrote them in place
  ensure_grad_buffers();
  // Every gradient of the unit is in unsharded_grad_: reduce-scatter now, overlapping the
  // backward of the units before this one; the root waits for it at the end of backward.
  at::Tensor source = unsharded_grad_.tensor();
  if (reduce_dtype_ != param_dtype_) {
    reduce_input_.acquire(root_->pool());
    source = reduce_input_.tensor().copy_(source);
  }
  if (settings_.comm_fusion) {
    pending_reduce_.push_back(shard_comm_->reduce_scatter_blocks(reduction_output(), source, blocks_, settings_.reduce_op));
    return;
  }
  for (const auto& sp : params_) {
    pending_reduce_.push_back(shard_comm_->reduce_scatter(reduction_output().narrow(0, sp.shard_offset, sp.block),
                                                          source.narrow(0, sp.unsharded_offset, sp.block * shard_comm_->size()),
                                                          settings_.reduce_op));
  }
}

bool FSDPUnit::in_backward() const {
  return training_state_ == TrainingState::kPreBackward || training_state_ == TrainingState::kPostBackward;
}

void FSDPUnit::finish_reduce_scatter() {
  if (!in_backward() || !settings_.requires_gradient_sync) return;
  if (!reduce_issued_) issue_reduce_scatter();  // some parameters got no gradient
  for (auto& h : pending_reduce_) h.wait();
  pending_reduce_.clear();
  reduce_issued_ = false;
  // HSDP: the replica all-reduce runs while the root finishes the other units' reduce-scatters.
  if (replicate_comm_) pending_replicate_ = replicate_comm_->all_reduce(reduction_output(), settings_.reduce_op);
}

void FSDPUnit::finish_backward() {
  if (!in_backward()) return;
  enter({TrainingState::kPreBackward, TrainingState::kPostBackward}, TrainingState::kIdle);
  if (!settings_.requires_gradient_sync) {
    accumulating_ = true;  // keep the full gradients; the next synced backward reduces the sum
    if (settings_.reshard_after_backward && !is_root_) reshard();
    return;
  }
  if (pending_replicate_) {
    pending_replicate_->wait();
    pending_replicate_.reset();
  }
  for (auto& h : pending_replicated_) h.wait();
  pending_replicated_.clear();
  if (settings_.gradient_scaling_factor) {
    reduction_output().mul_(*settings_.gradient_scaling_factor);
    for (const auto& [name, p] : replicated_) {
      if (p.grad().defined()) p.mutable_grad().mul_(*settings_.gradient_scaling_factor);
    }
  }
  if (grad_path_ == GradPath::kReduceThenAdd) sharded_grad_.add_(reduced_);  // with offload: device -> host
  reduced_since_forward_ = true;
  unsharded_grad_.release(root_->pool());
  reduce_input_.release(root_->pool());
  accumulating_ = false;
  reshard();  // the optimizer steps on shards
  point_params_at_sharded();
}

}  // namespace hyperparallel::fsdp
