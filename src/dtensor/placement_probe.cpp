// Measuring a tensor's placement across a group. See dtensor/placement_probe.h.
#include "hyperparallel/dtensor/placement_probe.h"

#include <ATen/ATen.h>

namespace hyperparallel::dtensor {
namespace {

constexpr int64_t kMaxDims = 8;
constexpr int64_t kRecord = kMaxDims + 3;  // ndim, shape padded to kMaxDims, two fingerprints

int64_t normalized(int64_t dim, size_t ndim) { return dim < 0 ? dim + static_cast<int64_t>(ndim) : dim; }

// The dim where the ranks' shapes differ, or where a known global size exceeds the local one;
// -1 when there is none (or several: not a single shard).
int64_t sharded_dim(const ObservedLayout& o, const KnownSizes& known) {
  const auto& first = o.shapes.front();
  int64_t found = -1;
  for (size_t d = 0; d < first.size(); ++d) {
    bool differs = false;
    for (const auto& s : o.shapes) differs |= s.size() != first.size() || s[d] != first[d];
    const auto it = known.find(static_cast<int64_t>(d));
    if (it != known.end() && it->second != first[d]) differs = true;
    if (!differs) continue;
    if (found >= 0) return -1;
    found = static_cast<int64_t>(d);
  }
  return found;
}

}  // namespace

ObservedLayout observe_layout(const at::Tensor& local, comm::Communicator& group) {
  at::NoGradGuard no_grad;
  const int64_t n = group.size();
  at::Tensor mine = at::zeros({kRecord}, at::kDouble);
  auto* m = mine.data_ptr<double>();
  m[0] = static_cast<double>(local.dim());
  for (int64_t d = 0; d < std::min<int64_t>(local.dim(), kMaxDims); ++d) m[1 + d] = static_cast<double>(local.size(d));
  if (local.numel() > 0) {
    const at::Tensor flat = local.detach().reshape({-1}).to(at::kDouble);
    m[kMaxDims + 1] = flat.sum().item<double>();
    m[kMaxDims + 2] = (flat * at::linspace(1.0, 2.0, flat.numel(), at::kDouble)).sum().item<double>();
  }
  at::Tensor all = at::empty({n * kRecord}, at::kDouble);
  group.all_gather(all, mine).wait();
  ObservedLayout o;
  const auto* a = all.data_ptr<double>();
  for (int64_t r = 0; r < n; ++r) {
    const double* rec = a + r * kRecord;
    std::vector<int64_t> shape;
    for (int64_t d = 0; d < static_cast<int64_t>(rec[0]); ++d) shape.push_back(static_cast<int64_t>(rec[1 + d]));
    o.shapes.push_back(shape);
  }
  o.same_shapes = true;
  o.same_values = true;
  for (int64_t r = 1; r < n; ++r) {
    const double* rec = a + r * kRecord;
    o.same_shapes &= o.shapes[r] == o.shapes[0];
    o.same_values &= rec[kMaxDims + 1] == a[kMaxDims + 1] && rec[kMaxDims + 2] == a[kMaxDims + 2];
  }
  o.same_values &= o.same_shapes;
  return o;
}

bool ObservedLayout::fits(const Placement& expected, const KnownSizes& known) const {
  const auto& first = shapes.front();
  const auto full = [&](const std::vector<int64_t>& s) {
    for (const auto& [d, size] : known) {
      if (d >= static_cast<int64_t>(s.size()) || s[d] != size) return false;
    }
    return true;
  };
  if (expected.is_replicate()) return same_values && full(first);
  if (expected.is_partial()) return same_shapes && full(first);
  const int64_t d = normalized(expected.dim(), first.size());
  if (d < 0 || d >= static_cast<int64_t>(first.size())) return false;
  int64_t total = 0;
  for (const auto& s : shapes) {
    if (s.size() != first.size()) return false;
    for (size_t i = 0; i < s.size(); ++i) {
      if (static_cast<int64_t>(i) != d && s[i] != first[i]) return false;
    }
    total += s[d];
  }
  const int64_t n = static_cast<int64_t>(shapes.size());
  if (n > 1 && same_values && first[d] > 0) return false;  // every rank holds the same piece: not a split
  const auto it = known.find(d);
  if (it != known.end() && it->second != total) return false;
  for (const auto& [kd, size] : known) {
    if (kd != d && (kd >= static_cast<int64_t>(first.size()) || first[kd] != size)) return false;
  }
  for (int64_t k = 0; k < n; ++k) {
    if (shapes[k][d] != shard_length(total, n, k)) return false;
  }
  return true;
}

std::string ObservedLayout::describe(const KnownSizes& known) const {
  const auto& first = shapes.front();
  if (same_values) return "Replicate() (the same " + shape_string(first) + " on every rank)";
  const int64_t d = sharded_dim(*this, known);
  if (d >= 0) {
    const auto it = known.find(d);
    std::string lengths;
    for (const auto& s : shapes) lengths += (lengths.empty() ? "" : ", ") + std::to_string(s[d]);
    return "Shard(" + std::to_string(d) + ") (lengths " + lengths + " on dim " + std::to_string(d) +
           (it != known.end() ? " of " + std::to_string(it->second) : "") + ", shape " + shape_string(first) + " on rank 0)";
  }
  if (same_shapes) return "Partial(sum) or diverged (the same shape " + shape_string(first) + " on every rank, different values)";
  std::string all;
  for (const auto& s : shapes) all += (all.empty() ? "" : ", ") + shape_string(s);
  return "no single placement (shapes " + all + ")";
}

}  // namespace hyperparallel::dtensor
