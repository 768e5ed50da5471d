#include "shard_collectives.h"

#include <ATen/ATen.h>

#include "hyperparallel/dtensor/placement.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::dtensor {

std::vector<int64_t> AxisGroups::shape() const {
  std::vector<int64_t> out;
  for (const auto& c : comms) out.push_back(c->size());
  return out;
}

std::vector<int64_t> AxisGroups::coords() const {
  std::vector<int64_t> out;
  for (const auto& c : comms) out.push_back(c->rank());
  return out;
}

namespace {

int64_t ceil_chunk(int64_t size, int64_t n) { return (size + n - 1) / n; }

// `x` with dim moved to the front, contiguous, and padded with zeros to `rows` rows.
at::Tensor front_padded(const at::Tensor& x, int64_t dim, int64_t rows) {
  at::Tensor front = x.movedim(dim, 0);
  if (front.size(0) == rows) return front.contiguous();
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] = rows;
  at::Tensor padded = at::zeros(shape, x.options());
  padded.narrow(0, 0, front.size(0)).copy_(front);
  return padded;
}

// The first `rows` rows of a front-moved tensor, back in place, contiguous.
at::Tensor restore_dim(const at::Tensor& front, int64_t rows, int64_t dim) {
  return front.narrow(0, 0, rows).movedim(0, dim).contiguous();
}

void check_dim(const at::Tensor& x, int64_t dim, const char* what) {
  if (dim < 0 || dim >= x.dim()) {
    throw UserError(std::string(what) + ": dim " + std::to_string(dim) + " is out of range for a tensor of " +
                    std::to_string(x.dim()) + " dims");
  }
}

}  // namespace

at::Tensor gather_shards(const at::Tensor& shard, int64_t dim, int64_t size, comm::Communicator& group) {
  check_dim(shard, dim, "all-gather of shards");
  const int64_t n = group.size();
  const int64_t mine = shard_length(size, n, group.rank());
  if (shard.size(dim) != mine) {
    throw UserError("all-gather of shards on group '" + group.name() + "': rank " + std::to_string(group.rank()) +
                    " holds " + std::to_string(shard.size(dim)) + " of dim " + std::to_string(dim) + ", expected " +
                    std::to_string(mine) + " (the ceil split of " + std::to_string(size) + " over " +
                    std::to_string(n) + " ranks)");
  }
  const int64_t chunk = ceil_chunk(size, n);
  at::Tensor piece = front_padded(shard, dim, chunk);
  std::vector<int64_t> shape = piece.sizes().vec();
  shape[0] = chunk * n;
  at::Tensor out = at::empty(shape, shard.options());
  group.all_gather(out, piece).wait();
  return restore_dim(out, size, dim);
}

at::Tensor reduce_scatter_shards(const at::Tensor& full, int64_t dim, comm::ReduceOp op, comm::Communicator& group) {
  check_dim(full, dim, "reduce-scatter into shards");
  const int64_t n = group.size();
  const int64_t size = full.size(dim);
  const int64_t chunk = ceil_chunk(size, n);
  at::Tensor in = front_padded(full, dim, chunk * n);
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] = chunk;
  at::Tensor out = at::empty(shape, full.options());
  group.reduce_scatter(out, in, op).wait();
  return restore_dim(out, shard_length(size, n, group.rank()), dim);
}

at::Tensor all_reduce_copy(const at::Tensor& x, comm::ReduceOp op, comm::Communicator& group) {
  at::Tensor out = x.contiguous().clone();
  group.all_reduce(out, op).wait();
  return out;
}

at::Tensor all_to_all_shards(const at::Tensor& shard, int64_t from_dim, int64_t from_size, int64_t to_dim,
                             comm::Communicator& group) {
  check_dim(shard, from_dim, "all-to-all of shards");
  check_dim(shard, to_dim, "all-to-all of shards");
  const int64_t n = group.size(), me = group.rank();
  const int64_t to_size = shard.size(to_dim);
  // Piece k of my shard (its rows of to_dim) goes to rank k, flattened back to back.
  std::vector<at::Tensor> sends;
  std::vector<int64_t> in_splits, out_splits;
  std::vector<std::vector<int64_t>> recv_shapes;
  for (int64_t k = 0; k < n; ++k) {
    at::Tensor piece = shard.narrow(to_dim, shard_offset(to_size, n, k), shard_length(to_size, n, k));
    sends.push_back(piece.contiguous().view({-1}));
    in_splits.push_back(piece.numel());
    std::vector<int64_t> shape = shard.sizes().vec();
    shape[from_dim] = shard_length(from_size, n, k);
    shape[to_dim] = shard_length(to_size, n, me);
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    out_splits.push_back(numel);
    recv_shapes.push_back(shape);
  }
  at::Tensor in = at::cat(sends);
  int64_t total = 0;
  for (int64_t s : out_splits) total += s;
  at::Tensor out = at::empty({total}, shard.options());
  group.all_to_all(out, in, out_splits, in_splits).wait();
  std::vector<at::Tensor> pieces;
  int64_t offset = 0;
  for (int64_t k = 0; k < n; ++k) {
    pieces.push_back(out.narrow(0, offset, out_splits[k]).view(recv_shapes[k]));
    offset += out_splits[k];
  }
  return at::cat(pieces, from_dim);
}

at::Tensor slice_shard(const at::Tensor& full, int64_t dim, comm::Communicator& group) {
  check_dim(full, dim, "shard of a replicated tensor");
  const int64_t size = full.size(dim), n = group.size(), me = group.rank();
  return full.narrow(dim, shard_offset(size, n, me), shard_length(size, n, me)).contiguous();
}

at::Tensor all_to_all_rows(const at::Tensor& input, const std::vector<int64_t>& output_splits,
                           const std::vector<int64_t>& input_splits, comm::Communicator& group) {
  if (input.dim() == 0) throw UserError("all_to_all: the input needs at least one dim (rows)");
  int64_t rows = 0;
  for (int64_t s : output_splits) rows += s;
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = output_splits.empty() ? input.size(0) : rows;
  at::Tensor out = at::empty(shape, input.options());
  group.all_to_all(out, input.contiguous(), output_splits, input_splits).wait();
  return out;
}

}  // namespace hyperparallel::dtensor
