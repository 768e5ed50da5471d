#include "fsdp_unit.h"

#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::fsdp {

// ---- memory ------------------------------------------------------------------------------

c10::DataPtr WarmMemoryPool::take(size_t nbytes) {
  auto& list = free_[nbytes];
  if (!list.empty()) {
    c10::DataPtr p = std::move(list.back());
    list.pop_back();
    return p;
  }
  return c10::GetCPUAllocator()->allocate(nbytes);
}

void WarmMemoryPool::give(size_t nbytes, c10::DataPtr memory) { free_[nbytes].push_back(std::move(memory)); }

ReleasableBuffer::ReleasableBuffer(int64_t numel, at::ScalarType dtype)
    : tensor_(at::empty({numel}, at::TensorOptions().dtype(dtype))),
      nbytes_(static_cast<size_t>(numel) * c10::elementSize(dtype)),
      allocated_(true) {}

void ReleasableBuffer::acquire(WarmMemoryPool* pool) {
  if (allocated_) return;
  c10::StorageImpl* storage = tensor_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(pool ? pool->take(nbytes_) : c10::GetCPUAllocator()->allocate(nbytes_));
  storage->set_nbytes(nbytes_);
  allocated_ = true;
}

void ReleasableBuffer::release(WarmMemoryPool* pool) {
  if (!allocated_) return;
  c10::StorageImpl* storage = tensor_.storage().unsafeGetStorageImpl();
  c10::DataPtr memory = storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
  storage->set_nbytes(0);
  if (pool) pool->give(nbytes_, std::move(memory));
  allocated_ = false;
}

at::Tensor ReleasableBuffer::alias(int64_t offset, at::IntArrayRef shape) const {
  at::Tensor out = at::empty({0}, tensor_.options());
  out.set_(tensor_.storage(), offset, shape, c10::contiguous_strides(shape));
  return out;
}

namespace {

at::Tensor alias_of(const at::Tensor& flat, int64_t offset, at::IntArrayRef shape) {
  at::Tensor out = at::empty({0}, flat.options());
  out.set_(flat.storage(), flat.storage_offset() + offset, shape, c10::contiguous_strides(shape));
  return out;
}

std::vector<int64_t> with_dim0(const std::vector<int64_t>& shape, int64_t rows) {
  std::vector<int64_t> s = shape;
  if (s.empty()) return {rows};
  s[0] = rows;
  return s;
}

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

const char* to_string(UnitState state) {
  return state == UnitState::kSharded ? "SHARDED" : "UNSHARDED";
}

// ---- construction ------------------------------------------------------------------------

FSDPUnit::FSDPUnit(torch::nn::Module& module, std::vector<std::pair<std::string, at::Tensor>> params,
                   std::shared_ptr<comm::Communicator> comm, const FullyShardOptions& options)
    : module_(module), comm_(std::move(comm)), options_(options) {
  const int64_t n = comm_->size(), me = comm_->rank();
  int64_t shard_total = 0;
  for (auto& [name, p] : params) {
    if (p.scalar_type() != at::kFloat) {
      throw UserError("fully_shard: parameter " + name + " is " + std::string(c10::toString(p.scalar_type())) +
                      "; parameters must be fp32 masters (mixed precision is not supported yet)");
    }
    ShardedParam sp;
    sp.name = name;
    sp.param = p;
    sp.shape = p.sizes().vec();
    sp.dim0 = p.dim() == 0 ? 1 : p.size(0);
    sp.row_numel = sp.dim0 == 0 ? 0 : p.numel() / sp.dim0;
    const int64_t rows_per_rank = (sp.dim0 + n - 1) / n;
    sp.block = rows_per_rank * sp.row_numel;
    sp.local_rows = std::max<int64_t>(0, std::min(sp.dim0, (me + 1) * rows_per_rank) - me * rows_per_rank);
    sp.shard_offset = shard_total;
    sp.unsharded_offset = shard_total * n;
    shard_total += sp.block;
    blocks_.push_back(sp.block);
    params_.push_back(std::move(sp));
  }
  sharded_ = at::zeros({shard_total});
  sharded_grad_ = at::zeros({shard_total});
  reduced_ = at::zeros({shard_total});
  unsharded_ = ReleasableBuffer(shard_total * n, at::kFloat);
  unsharded_grad_ = ReleasableBuffer(shard_total * n, at::kFloat);
  unsharded_.release(nullptr);
  unsharded_grad_.release(nullptr);
  at::NoGradGuard no_grad;
  for (auto& sp : params_) {
    if (sp.local_rows > 0) {
      const at::Tensor rows = sp.param.reshape({sp.dim0, sp.row_numel}).narrow(0, me * (sp.block / std::max<int64_t>(sp.row_numel, 1)), sp.local_rows);
      sharded_.narrow(0, sp.shard_offset, sp.local_rows * sp.row_numel).copy_(rows.reshape({-1}));
    }
  }
  point_params_at_sharded();
}

// ---- state machine -----------------------------------------------------------------------

void FSDPUnit::transition(UnitState from, UnitState to) {
  if (state_ != from) {
    throw std::logic_error(std::string("FSDP unit ") + module_.name() + ": transition " + to_string(from) + " -> " +
                           to_string(to) + " from state " + to_string(state_));
  }
  state_ = to;
}

void FSDPUnit::point_params_at_sharded() {
  for (auto& sp : params_) {
    sp.param.set_data(alias_of(sharded_, sp.shard_offset, with_dim0(sp.shape, sp.local_rows)));
    if (sp.param.requires_grad()) {
      sp.param.mutable_grad() = alias_of(sharded_grad_, sp.shard_offset, with_dim0(sp.shape, sp.local_rows));
    }
  }
}

void FSDPUnit::point_params_at_unsharded() {
  for (auto& sp : params_) sp.param.set_data(unsharded_.alias(sp.unsharded_offset, sp.shape));
}

void FSDPUnit::unshard() {
  if (state_ == UnitState::kUnsharded) return;
  unsharded_.acquire(pool_.get());
  comm_->all_gather_blocks(unsharded_.tensor(), sharded_, blocks_).wait();
  point_params_at_unsharded();
  transition(UnitState::kSharded, UnitState::kUnsharded);
}

void FSDPUnit::reshard() {
  if (state_ == UnitState::kSharded) return;
  for (auto& sp : params_) sp.param.set_data(alias_of(sharded_, sp.shard_offset, with_dim0(sp.shape, sp.local_rows)));
  unsharded_.release(pool_.get());
  transition(UnitState::kUnsharded, UnitState::kSharded);
}

// ---- forward -----------------------------------------------------------------------------

void FSDPUnit::lazy_init_root() {
  // The first unit to run forward with no root is the root; it adopts every unit below it.
  is_root_ = true;
  pool_ = std::make_shared<WarmMemoryPool>();
  for (const auto& item : module_.named_modules()) {
    ModuleHooks* hooks = find_hooks(*item.value());
    auto* unit = dynamic_cast<FSDPUnit*>(hooks);
    if (!unit) continue;
    unit->root_ = this;
    unit->pool_ = pool_;
    all_units_.push_back(unit);
  }
}

void FSDPUnit::pre_forward() {
  if (!root_) lazy_init_root();
  unshard();
  if (grad_accumulators_.empty()) {
    // Created while the parameters have their full shape: autograd checks gradient shapes
    // against the accumulator's metadata.
    std::weak_ptr<FSDPUnit> self = weak_from_this();
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].param.requires_grad()) continue;
      auto acc = torch::autograd::impl::grad_accumulator(params_[i].param);
      acc->add_post_hook(std::make_unique<GradReadyHook>(self, [this, i] { on_grad_ready(i); }));
      grad_accumulators_.push_back(std::move(acc));
    }
  }
}

at::Tensor FSDPUnit::post_forward(at::Tensor output) {
  const bool keep = is_root_ || !options_.reshard_after_forward;
  if (!keep) reshard();
  if (output.requires_grad()) {
    std::weak_ptr<FSDPUnit> self = weak_from_this();
    output.register_hook([self](const at::Tensor&) {
      if (auto unit = self.lock()) unit->pre_backward();
    });
  }
  return output;
}

// ---- backward ----------------------------------------------------------------------------

void FSDPUnit::pre_backward() {
  if (in_backward_) return;  // an output used twice fires twice
  in_backward_ = true;
  if (root_ && !root_->backward_callback_queued_) {
    root_->backward_callback_queued_ = true;
    FSDPUnit* root = root_;
    torch::autograd::Engine::get_default_engine().queue_callback([root] { root->finish_backward(); });
  }
  unshard();
  unsharded_grad_.acquire(pool_.get());
  unsharded_grad_.tensor().zero_();
  for (auto& sp : params_) {
    sp.grad_ready = false;
    if (sp.param.requires_grad()) sp.param.mutable_grad() = unsharded_grad_.alias(sp.unsharded_offset, sp.shape);
  }
  grads_ready_ = 0;
}

void FSDPUnit::on_grad_ready(size_t index) {
  if (!in_backward_ || params_[index].grad_ready) return;
  params_[index].grad_ready = true;
  if (++grads_ready_ == grad_accumulators_.size()) issue_reduce_scatter();
}

void FSDPUnit::issue_reduce_scatter() {
  // Every gradient of the unit is in unsharded_grad_: reduce-scatter now, overlapping the
  // backward of the units before this one; the root waits for it at the end of backward.
  pending_reduce_ = comm_->reduce_scatter_blocks(reduced_, unsharded_grad_.tensor(), blocks_, comm::ReduceOp::kAvg);
  if (!is_root_) reshard();
}

void FSDPUnit::finish_reduce_scatter() {
  if (!in_backward_) return;
  if (!pending_reduce_) issue_reduce_scatter();  // some parameters got no gradient this step
  pending_reduce_->wait();
  pending_reduce_.reset();
  sharded_grad_.add_(reduced_);
  unsharded_grad_.release(pool_.get());
  reshard();
  point_params_at_sharded();
  in_backward_ = false;
}

void FSDPUnit::finish_backward() {
  for (FSDPUnit* unit : all_units_) unit->finish_reduce_scatter();
  backward_callback_queued_ = false;
}

// ---- API ---------------------------------------------------------------------------------

UnitState FSDPModule::state() const { return unit_->state(); }
void FSDPModule::unshard() { unit_->unshard(); }
void FSDPModule::reshard() { unit_->reshard(); }
int64_t FSDPModule::sharded_numel() const { return unit_->sharded_numel(); }
int64_t FSDPModule::unsharded_numel() const { return unit_->unsharded_numel(); }

}  // namespace hyperparallel::fsdp
