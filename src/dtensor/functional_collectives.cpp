#include "hyperparallel/dtensor/functional_collectives.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "hyperparallel/platform/user_error.h"
#include "redistribute_function.h"

namespace hyperparallel::dtensor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::shared_ptr<comm::Communicator> shared(comm::Communicator& group) { return group.shared_from_this(); }

at::Tensor one_axis(const at::Tensor& x, comm::Communicator& group, std::vector<int64_t> global_shape, Placement from,
                    Placement to, std::optional<Placement> grad_of_output = std::nullopt) {
  RedistributeCall call{AxisGroups{{shared(group)}}, std::move(global_shape), {from}, {to}, std::nullopt};
  if (grad_of_output) call.grad_of_output = Placements{*grad_of_output};
  return redistribute_differentiable(x, std::move(call));
}

struct GroupHolder : torch::CustomClassHolder {
  std::shared_ptr<comm::Communicator> group;
  std::vector<int64_t> output_splits, input_splits;
};

struct AllToAllFunction : torch::autograd::Function<AllToAllFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<GroupHolder> holder) {
    at::Tensor out = all_to_all_rows(x, holder->output_splits, holder->input_splits, *holder->group);
    ctx->saved_data["call"] = at::IValue::make_capsule(std::move(holder));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<GroupHolder>(ctx->saved_data["call"].toCapsule());
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    return {all_to_all_rows(grads[0], holder->input_splits, holder->output_splits, *holder->group), at::Tensor()};
  }
};

}  // namespace

at::Tensor all_gather_into(const at::Tensor& x, int64_t dim, comm::Communicator& group, const AllGatherOptions& options) {
  if (dim < 0 || dim >= x.dim()) {
    throw UserError("all_gather_into: dim " + std::to_string(dim) + " is out of range for a tensor of " +
                    std::to_string(x.dim()) + " dims");
  }
  std::vector<int64_t> shape = x.sizes().vec();
  shape[dim] = options.global_size >= 0 ? options.global_size : x.size(dim) * group.size();
  const Placement grad = options.grad == GradIs::kPartial ? Partial() : Replicate();
  return one_axis(x, group, std::move(shape), Shard(dim), Replicate(), grad);
}

at::Tensor reduce_scatter(const at::Tensor& x, int64_t dim, comm::Communicator& group, comm::ReduceOp op) {
  return one_axis(x, group, x.sizes().vec(), Partial(op), Shard(dim));
}

at::Tensor all_reduce(const at::Tensor& x, comm::Communicator& group, comm::ReduceOp op, GradIs grad) {
  return one_axis(x, group, x.sizes().vec(), Partial(op), Replicate(),
                  grad == GradIs::kPartial ? Partial() : Replicate());
}

at::Tensor reduce_grad(const at::Tensor& x, comm::Communicator& group) {
  return one_axis(x, group, x.sizes().vec(), Replicate(), Replicate(), Partial());
}

at::Tensor local_shard(const at::Tensor& x, int64_t dim, comm::Communicator& group) {
  return one_axis(x, group, x.sizes().vec(), Replicate(), Shard(dim));
}

at::Tensor all_to_all(const at::Tensor& x, comm::Communicator& group, const std::vector<int64_t>& output_splits,
                      const std::vector<int64_t>& input_splits) {
  auto holder = c10::make_intrusive<GroupHolder>();
  holder->group = shared(group);
  holder->output_splits = output_splits;
  holder->input_splits = input_splits;
  return AllToAllFunction::apply(x, std::move(holder));
}

}  // namespace hyperparallel::dtensor
