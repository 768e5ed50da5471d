#include "redistribute_local.h"

#include <ATen/ATen.h>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::dtensor {
namespace {

class Redistribution {
 public:
  Redistribution(const AxisGroups& axes, const std::vector<int64_t>& global_shape, const Placements& from,
                 const Placements& to)
      : axes_(axes), global_(global_shape), from_(from), to_(to), cur_(from), axis_count_(static_cast<int>(from.size())) {}

  at::Tensor run(at::Tensor x) {
    x = unshard(std::move(x));
    x = reduce_partials(std::move(x));
    return shard(std::move(x));
  }

 private:
  // The length of `dim` that axis `axis` splits: the global length, split by the axes
  // before it that currently shard the same dim.
  int64_t level_size(int axis, int64_t dim) const {
    int64_t size = global_[dim];
    for (int j = 0; j < axis; ++j) {
      if (cur_[j].is_shard(dim)) size = shard_length(size, axes_.size(j), axes_.coord(j));
    }
    return size;
  }

  bool other_axis_shards(int axis, int64_t dim) const {
    for (int j = 0; j < axis_count_; ++j) {
      if (j != axis && (from_[j].is_shard(dim) || to_[j].is_shard(dim))) return true;
    }
    return false;
  }

  // A Shard axis keeps its piece when its placement does not change and no outer axis that
  // shards the same dim changes either.
  std::vector<bool> stable_shards() const {
    std::vector<bool> stable(axis_count_, false);
    for (int i = 0; i < axis_count_; ++i) {
      if (!from_[i].is_shard() || from_[i] != to_[i]) continue;
      const int64_t d = from_[i].dim();
      bool ok = true;
      for (int j = 0; j < i; ++j) {
        if ((from_[j].is_shard(d) || to_[j].is_shard(d)) && !stable[j]) ok = false;
      }
      stable[i] = ok;
    }
    return stable;
  }

  at::Tensor unshard(at::Tensor x) {
    const std::vector<bool> stable = stable_shards();
    for (int i = axis_count_ - 1; i >= 0; --i) {
      if (!cur_[i].is_shard() || stable[i]) continue;
      const int64_t d = cur_[i].dim();
      auto& group = *axes_.comms[i];
      if (to_[i].is_shard() && to_[i].dim() != d && !other_axis_shards(i, d) && !other_axis_shards(i, to_[i].dim())) {
        x = all_to_all_shards(x, d, level_size(i, d), to_[i].dim(), group);
        cur_[i] = to_[i];
      } else {
        x = gather_shards(x, d, level_size(i, d), group);
        cur_[i] = Replicate();
      }
    }
    return x;
  }

  // Reduce-scatter on axis i into Shard(d) is right when every outer axis that will shard d
  // already does and no inner axis shards d yet.
  bool can_reduce_scatter(int axis, int64_t dim) const {
    for (int j = 0; j < axis_count_; ++j) {
      if (j < axis && to_[j].is_shard(dim) && cur_[j] != to_[j]) return false;
      if (j > axis && cur_[j].is_shard(dim)) return false;
    }
    return true;
  }

  at::Tensor reduce_partials(at::Tensor x) {
    for (int i = 0; i < axis_count_; ++i) {
      if (!cur_[i].is_partial() || cur_[i] == to_[i]) continue;
      auto& group = *axes_.comms[i];
      const comm::ReduceOp op = cur_[i].reduce_op();
      if (to_[i].is_shard() && can_reduce_scatter(i, to_[i].dim())) {
        x = reduce_scatter_shards(x, to_[i].dim(), op, group);
        cur_[i] = to_[i];
      } else {
        x = all_reduce_copy(x, op, group);
        cur_[i] = Replicate();
      }
    }
    return x;
  }

  at::Tensor shard(at::Tensor x) {
    for (int i = 0; i < axis_count_; ++i) {
      if (cur_[i] == to_[i]) continue;
      TORCH_INTERNAL_ASSERT(cur_[i].is_replicate(), "redistribute: axis ", i, " is ", cur_[i].to_string(),
                            " before its final step");
      if (to_[i].is_shard()) {
        x = slice_shard(x, to_[i].dim(), *axes_.comms[i]);
      } else if (to_[i].reduce_op() == comm::ReduceOp::kSum && axes_.coord(i) != 0) {
        x = at::zeros_like(x);
      }
      cur_[i] = to_[i];
    }
    return x;
  }

  const AxisGroups& axes_;
  const std::vector<int64_t>& global_;
  const Placements& from_;
  const Placements& to_;
  Placements cur_;
  int axis_count_;
};

}  // namespace

at::Tensor redistribute_local(const at::Tensor& local, const AxisGroups& axes, const std::vector<int64_t>& global_shape,
                              const Placements& from, const Placements& to) {
  const int64_t dims = static_cast<int64_t>(global_shape.size());
  const int64_t mesh_axes = static_cast<int64_t>(axes.comms.size());
  check_placements(from, dims, mesh_axes, "redistribute (source)");
  check_placements(to, dims, mesh_axes, "redistribute (target)");
  const Box box = local_box(global_shape, from, axes.shape(), axes.coords());
  if (local.sizes().vec() != box.lengths) {
    throw UserError("redistribute: the local tensor has shape " + shape_string(local.sizes().vec()) + " but " +
                    to_string(from) + " of global " + shape_string(global_shape) + " gives this rank " +
                    shape_string(box.lengths));
  }
  if (from == to) return local;
  return Redistribution(axes, global_shape, from, to).run(local);
}

}  // namespace hyperparallel::dtensor
