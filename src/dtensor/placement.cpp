#include "hyperparallel/dtensor/placement.h"

#include <algorithm>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::dtensor {

Placement Placement::partial(comm::ReduceOp op) {
  if (op != comm::ReduceOp::kSum && op != comm::ReduceOp::kAvg) {
    throw UserError(std::string("Partial(") + comm::to_string(op) + ") is not a placement; use Partial(sum) or Partial(avg)");
  }
  return Placement(Kind::kPartial, -1, op);
}

std::string Placement::to_string() const {
  switch (kind_) {
    case Kind::kShard: return "Shard(" + std::to_string(dim_) + ")";
    case Kind::kReplicate: return "Replicate()";
    case Kind::kPartial: return std::string("Partial(") + comm::to_string(op_) + ")";
  }
  return "?";
}

bool Placement::operator==(const Placement& other) const {
  if (kind_ != other.kind_) return false;
  if (kind_ == Kind::kShard) return dim_ == other.dim_;
  if (kind_ == Kind::kPartial) return op_ == other.op_;
  return true;
}

std::string to_string(const Placements& placements) {
  std::string out = "[";
  for (size_t i = 0; i < placements.size(); ++i) {
    if (i) out += ", ";
    out += placements[i].to_string();
  }
  return out + "]";
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

int64_t shard_length(int64_t size, int64_t n, int64_t k) {
  const int64_t chunk = (size + n - 1) / n;
  const int64_t begin = std::min(size, k * chunk);
  return std::min(size, begin + chunk) - begin;
}

int64_t shard_offset(int64_t size, int64_t n, int64_t k) { return std::min(size, k * ((size + n - 1) / n)); }

void check_placements(const Placements& placements, int64_t tensor_dims, int64_t mesh_axes, const std::string& what) {
  if (static_cast<int64_t>(placements.size()) != mesh_axes) {
    throw UserError(what + ": " + std::to_string(placements.size()) + " placements " + to_string(placements) +
                    " for a mesh of " + std::to_string(mesh_axes) + " axes; give one placement per mesh axis");
  }
  for (const Placement& p : placements) {
    if (p.is_shard() && (p.dim() < 0 || p.dim() >= tensor_dims)) {
      throw UserError(what + ": " + p.to_string() + " is out of range for a tensor of " + std::to_string(tensor_dims) +
                      " dims; shard a dim in [0, " + std::to_string(tensor_dims) + ")");
    }
  }
}

Box local_box(const std::vector<int64_t>& global_shape, const Placements& placements,
              const std::vector<int64_t>& mesh_shape, const std::vector<int64_t>& coords) {
  const int64_t dims = static_cast<int64_t>(global_shape.size());
  check_placements(placements, dims, static_cast<int64_t>(mesh_shape.size()), "local_box");
  if (coords.size() != mesh_shape.size()) {
    throw UserError("local_box: " + std::to_string(coords.size()) + " coordinates for a mesh of " +
                    std::to_string(mesh_shape.size()) + " axes");
  }
  Box box{std::vector<int64_t>(dims, 0), global_shape};
  for (size_t axis = 0; axis < placements.size(); ++axis) {
    if (!placements[axis].is_shard()) continue;
    const int64_t d = placements[axis].dim();
    box.offsets[d] += shard_offset(box.lengths[d], mesh_shape[axis], coords[axis]);
    box.lengths[d] = shard_length(box.lengths[d], mesh_shape[axis], coords[axis]);
  }
  return box;
}

}  // namespace hyperparallel::dtensor
