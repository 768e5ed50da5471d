#include "hyperparallel/fsdp/clip_grad_norm.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "fsdp_unit.h"
#include "hyperparallel/dtensor/parameter_specs.h"

namespace hyperparallel::fsdp {

std::vector<double> gradient_norm_weights(torch::nn::Module& root, int64_t world_size, int64_t pipeline_stages) {
  // How many distinct pieces of each parameter exist: FSDP's shard count times the spec's.
  std::map<const c10::TensorImpl*, int64_t> fsdp_pieces;
  for (FSDPUnit* unit : units_under(root).units) {
    for (const auto& sp : unit->params()) fsdp_pieces[sp.param.unsafeGetTensorImpl()] = unit->shard_size();
  }
  std::vector<double> weights;
  const auto& owners = dtensor::parameter_owners(root);
  for (const auto& item : root.named_parameters()) {
    const auto it = fsdp_pieces.find(item.value().unsafeGetTensorImpl());
    int64_t pieces = it == fsdp_pieces.end() ? 1 : it->second;
    const auto owned = owners.find(item.key());
    if (owned != owners.end()) pieces *= owned->second.group->size();  // one holder per group
    if (const dtensor::DTensorSpec* spec = dtensor::find_parameter_spec(root, item.key())) {
      for (size_t axis = 0; axis < spec->placements().size(); ++axis) {
        if (spec->placements()[axis].is_shard()) pieces *= spec->mesh().shape()[axis];
      }
    }
    weights.push_back(static_cast<double>(pieces * pipeline_stages) / static_cast<double>(world_size));
  }
  return weights;
}

namespace {

// Sum of squares in fp64, a slice at a time: a whole [vocab x hidden] gradient cast to fp64
// and squared would be two temporaries 2x its size each (1.2 GB for Qwen3's embedding).
at::Tensor squared_sum(const at::Tensor& grad) {
  constexpr int64_t kSlice = 1 << 20;
  if (!grad.is_contiguous() || grad.numel() <= kSlice) return grad.to(at::kDouble).pow(2).sum();
  const at::Tensor flat = grad.view({-1});
  at::Tensor sum = at::zeros({}, at::kDouble);
  for (int64_t start = 0; start < flat.numel(); start += kSlice) {
    sum += flat.narrow(0, start, std::min(kSlice, flat.numel() - start)).to(at::kDouble).pow(2).sum();
  }
  return sum;
}

}  // namespace

at::Tensor local_squared_gradient_norm(torch::nn::Module& root, const std::vector<double>& weights) {
  at::Tensor sum = at::zeros({}, at::kDouble);
  size_t i = 0;
  for (const auto& p : root.parameters()) {
    const double w = weights.at(i++);
    if (p.grad().defined()) sum += squared_sum(p.grad()) * w;
  }
  return sum;
}

double clip_grad_norm_(torch::nn::Module& root, double max_norm, comm::Communicator& world, int64_t pipeline_stages) {
  at::Tensor sq = local_squared_gradient_norm(root, gradient_norm_weights(root, world.size(), pipeline_stages)).reshape({1});
  world.all_reduce(sq).wait();
  const double norm = std::sqrt(sq.item<double>());
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1) {
      for (const auto& p : root.parameters()) {
        if (p.grad().defined()) p.grad().mul_(coef);
      }
    }
  }
  return norm;
}

}  // namespace hyperparallel::fsdp
