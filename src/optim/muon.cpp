// Muon with owner-rank orthogonalisation. See optim/muon.h.
#include "hyperparallel/optim/muon.h"

#include <torch/nn/module.h>

#include <array>
#include <cmath>

#include "hyperparallel/dtensor/parameter_specs.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/optim/state_file.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::optim {

using BoxOf = std::array<int64_t, 4>;  // offset and length of dim 0, then dim 1; lengths 0: none

struct Muon::Layout {
  std::vector<std::string> names;            // every matrix of the whole model, in parameter order
  std::vector<std::vector<int64_t>> shapes;  // their whole shapes
  std::vector<at::Tensor> params;            // this rank's piece of each (undefined: none here)
  std::vector<std::vector<BoxOf>> boxes;     // boxes[r][i]: rank r's box of matrix i
  std::vector<std::vector<bool>> sends;      // sends[r][i]: rank r sends its box of U_i to the owner
  int ranks = 1;

  int owner(size_t i) const { return static_cast<int>(i % static_cast<size_t>(ranks)); }
  bool held(int r, size_t i) const { return boxes[r][i][1] > 0 && boxes[r][i][3] > 0; }
  at::Tensor box_of(const at::Tensor& full, int r, size_t i) const {
    const BoxOf& b = boxes[r][i];
    return full.narrow(0, b[0], b[1]).narrow(1, b[2], b[3]);
  }
};

namespace {

constexpr double kA = 3.4445, kB = -4.7750, kC = 2.0315;

double lr_scale(const std::string& adjust, const std::vector<int64_t>& shape) {
  const double rows = static_cast<double>(shape[0]), cols = static_cast<double>(shape[1]);
  return adjust == "original" ? std::sqrt(std::max(1.0, rows / cols)) : 0.2 * std::sqrt(std::max(rows, cols));
}

void check(const MuonOptions& o) {
  const auto fail = [](const std::string& what) { throw UserError("muon_config." + what); };
  if (!(o.lr >= 0)) fail("lr must be >= 0, got " + std::to_string(o.lr));
  if (!(o.momentum >= 0 && o.momentum < 1)) fail("momentum must be in [0, 1), got " + std::to_string(o.momentum));
  if (o.ns_steps < 1) fail("ns_steps must be >= 1, got " + std::to_string(o.ns_steps));
  if (!(o.weight_decay >= 0)) fail("weight_decay must be >= 0, got " + std::to_string(o.weight_decay));
  if (o.adjust_lr != "match_rms_adamw" && o.adjust_lr != "original") {
    fail("adjust_lr '" + o.adjust_lr + "' is not one of: match_rms_adamw, original");
  }
}

// This rank's box of each matrix from the sharded state dict, then every rank's over `world`.
void find_boxes(Muon::Layout& l, torch::nn::Module& root, comm::Communicator* world) {
  const size_t m = l.names.size();
  const auto shards = fsdp::sharded_state_dict(root);
  const auto params = root.named_parameters();
  std::vector<int64_t> mine(4 * m, 0);
  l.params.resize(m);
  for (size_t i = 0; i < m; ++i) {
    if (!params.contains(l.names[i])) continue;  // held by other ranks (an expert under EP)
    auto s = shards.find(l.names[i]);
    const at::Tensor& p = params[l.names[i]];
    if (s == shards.end() || s->second.lengths.size() != 2 || p.numel() != s->second.lengths[0] * s->second.lengths[1]) {
      throw UserError("Muon: " + l.names[i] + " has no 2-D box in the sharded state dict matching its local " +
                      std::to_string(p.numel()) + " elements; its layout is not one Muon can assemble");
    }
    l.params[i] = p;
    for (int d = 0; d < 2; ++d) {
      mine[4 * i + 2 * d] = s->second.offsets[d];
      mine[4 * i + 2 * d + 1] = s->second.lengths[d];
    }
  }
  at::Tensor all = at::tensor(mine, at::kLong);
  if (world && world->size() > 1) {
    at::Tensor gathered = at::empty({world->size() * static_cast<int64_t>(4 * m)}, at::kLong);
    if (m > 0) world->all_gather(gathered, all).wait();
    all = gathered;
  }
  const int64_t* v = all.data_ptr<int64_t>();
  l.boxes.assign(l.ranks, std::vector<BoxOf>(m));
  for (int r = 0; r < l.ranks; ++r) {
    for (size_t i = 0; i < m; ++i) {
      for (int k = 0; k < 4; ++k) l.boxes[r][i][k] = v[(static_cast<size_t>(r) * m + i) * 4 + k];
    }
  }
  l.sends.assign(l.ranks, std::vector<bool>(m, false));
  for (size_t i = 0; i < m; ++i) {
    int64_t covered = 0;
    for (int r = 0; r < l.ranks; ++r) {
      bool first = l.held(r, i);
      for (int t = 0; t < r && first; ++t) first = !(l.held(t, i) && l.boxes[t][i] == l.boxes[r][i]);
      l.sends[r][i] = first;
      if (first) covered += l.boxes[r][i][1] * l.boxes[r][i][3];
    }
    if (covered != l.shapes[i][0] * l.shapes[i][1]) {  // distinct boxes must tile the matrix
      throw UserError("Muon: the ranks' pieces of " + l.names[i] + " cover " + std::to_string(covered) + " of its " +
                      std::to_string(l.shapes[i][0] * l.shapes[i][1]) + " elements; every rank must hold its box");
    }
  }
}

}  // namespace

at::Tensor newton_schulz(const at::Tensor& u, int64_t steps) {
  at::Tensor x = u.to(at::kFloat);
  const bool tall = x.size(0) > x.size(1);
  if (tall) x = x.t();
  x = x / (x.norm() + 1e-7);
  for (int64_t k = 0; k < steps; ++k) {
    const at::Tensor a = at::mm(x, x.t());
    const at::Tensor b = kB * a + kC * at::mm(a, a);
    x = kA * x + at::mm(b, x);
  }
  return tall ? x.t().contiguous() : x;
}

bool takes_muon(const std::string& name, const std::vector<int64_t>& shape) {
  const auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return shape.size() == 2 && !ends_with("embed_tokens.weight") && !ends_with("lm_head.weight");
}

Muon::Muon(std::vector<torch::optim::OptimizerParamGroup> adamw_groups, const torch::optim::AdamWOptions& adamw,
           torch::nn::Module& root, const MuonOptions& muon, std::shared_ptr<comm::Communicator> world)
    : FusedAdamW(std::move(adamw_groups), adamw), layout_(std::make_unique<Layout>()), options_(muon), world_(std::move(world)) {
  check(muon);
  Layout& l = *layout_;
  l.ranks = world_ ? world_->size() : 1;
  const auto shapes = fsdp::full_parameter_shapes(root);
  for (const auto& name : dtensor::full_parameter_names(root)) {
    auto s = shapes.find(name);
    if (s != shapes.end() && takes_muon(name, s->second)) {
      l.names.push_back(name);
      l.shapes.push_back(s->second);
    }
  }
  find_boxes(l, root, world_.get());
  std::vector<at::Tensor> held;
  for (const auto& p : l.params) {
    if (p.defined()) held.push_back(p);
  }
  auto options = std::make_unique<torch::optim::AdamWOptions>(muon.lr);
  options->weight_decay(muon.weight_decay);
  add_param_group(torch::optim::OptimizerParamGroup(held, std::move(options)));
}

Muon::~Muon() = default;

size_t Muon::matrix_count() const { return layout_->names.size(); }

namespace {

int64_t area(const BoxOf& b) { return b[1] * b[3]; }

// One all-to-all of flat fp32 pieces: `parts` in destination order, `send[d]` / `receive[s]`
// elements per rank.
at::Tensor exchange(comm::Communicator& world, const std::vector<at::Tensor>& parts, const std::vector<int64_t>& send,
                    const std::vector<int64_t>& receive) {
  int64_t total = 0;
  for (int64_t n : receive) total += n;
  const at::Tensor input = parts.empty() ? at::zeros({0}, at::kFloat) : at::cat(parts);
  at::Tensor output = at::empty({total}, at::kFloat);
  world.all_to_all(output, input, receive, send).wait();
  return output;
}

// There: every distinct box of U to its matrix's owner, which assembles its matrices whole.
std::vector<at::Tensor> gather_on_owners(const Muon::Layout& l, comm::Communicator& world, const std::vector<at::Tensor>& updates) {
  const int me = world.rank();
  const size_t m = l.names.size();
  std::vector<at::Tensor> parts;
  std::vector<int64_t> send(l.ranks, 0), receive(l.ranks, 0);
  for (int d = 0; d < l.ranks; ++d) {
    for (size_t i = 0; i < m; ++i) {
      if (l.owner(i) == d && l.sends[me][i]) parts.push_back(updates[i].reshape({-1})), send[d] += area(l.boxes[me][i]);
      if (l.owner(i) == me && l.sends[d][i]) receive[d] += area(l.boxes[d][i]);
    }
  }
  const at::Tensor arrived = exchange(world, parts, send, receive);
  std::vector<at::Tensor> whole(m);
  int64_t offset = 0;
  for (int s = 0; s < l.ranks; ++s) {
    for (size_t i = 0; i < m; ++i) {
      if (l.owner(i) != me || !l.sends[s][i]) continue;
      if (!whole[i].defined()) whole[i] = at::zeros(l.shapes[i], at::kFloat);
      const BoxOf& b = l.boxes[s][i];
      l.box_of(whole[i], s, i).copy_(arrived.narrow(0, offset, area(b)).view({b[1], b[3]}));
      offset += area(b);
    }
  }
  return whole;
}

// Back: every holder its box of the owners' results.
std::vector<at::Tensor> return_boxes(const Muon::Layout& l, comm::Communicator& world, const std::vector<at::Tensor>& whole) {
  const int me = world.rank();
  const size_t m = l.names.size();
  std::vector<at::Tensor> parts;
  std::vector<int64_t> send(l.ranks, 0), receive(l.ranks, 0);
  for (int d = 0; d < l.ranks; ++d) {
    for (size_t i = 0; i < m; ++i) {
      if (l.owner(i) == me && l.held(d, i)) parts.push_back(l.box_of(whole[i], d, i).reshape({-1})), send[d] += area(l.boxes[d][i]);
      if (l.owner(i) == d && l.held(me, i)) receive[d] += area(l.boxes[me][i]);
    }
  }
  const at::Tensor returned = exchange(world, parts, send, receive);
  std::vector<at::Tensor> out(m);
  int64_t offset = 0;
  for (int d = 0; d < l.ranks; ++d) {
    for (size_t i = 0; i < m; ++i) {
      if (l.owner(i) != d || !l.held(me, i)) continue;
      const BoxOf& b = l.boxes[me][i];
      out[i] = returned.narrow(0, offset, area(b)).view({b[1], b[3]});
      offset += area(b);
    }
  }
  return out;
}

}  // namespace

std::vector<at::Tensor> Muon::orthogonalised(const std::vector<at::Tensor>& updates) {
  const Layout& l = *layout_;
  std::vector<at::Tensor> whole = l.ranks == 1 ? updates : gather_on_owners(l, *world_, updates);
  for (size_t i = 0; i < whole.size(); ++i) {
    if (whole[i].defined()) whole[i] = newton_schulz(whole[i], options_.ns_steps) * lr_scale(options_.adjust_lr, l.shapes[i]);
  }
  return l.ranks == 1 ? whole : return_boxes(l, *world_, whole);
}

at::Tensor Muon::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode grad_on(true);
    loss = closure();
  }
  step_groups(muon_group());
  const auto& group = static_cast<torch::optim::AdamWOptions&>(param_groups()[muon_group()].options());
  const double lr = group.lr(), decay = group.weight_decay(), momentum = options_.momentum;
  Layout& l = *layout_;
  std::vector<at::Tensor> updates(l.names.size());
  for (size_t i = 0; i < l.names.size(); ++i) {
    const at::Tensor& p = l.params[i];
    if (!p.defined() || !l.held(world_ ? world_->rank() : 0, i)) continue;
    void* const key = p.unsafeGetTensorImpl();
    auto found = state().find(key);
    if (found == state().end()) {
      auto fresh = std::make_unique<torch::optim::AdamWParamState>();
      fresh->step(0);
      fresh->exp_avg(at::zeros_like(p, at::kFloat));
      fresh->exp_avg_sq(at::zeros({1}, at::kFloat).expand(p.sizes()));  // unused: Muon keeps one buffer
      found = state().emplace(key, std::move(fresh)).first;
    }
    auto& s = static_cast<torch::optim::AdamWParamState&>(*found->second);
    if (state_file()) stream_in(p, s);
    if (s.exp_avg_sq().numel() > 1 && s.exp_avg_sq().stride(0) != 0) {  // materialised (a checkpoint load, the offload file)
      s.exp_avg_sq(at::zeros({1}, at::kFloat).expand(p.sizes()));
    }
    s.step(s.step() + 1);
    const at::Tensor grad = p.grad().defined() ? p.grad().to(at::kFloat) : at::zeros_like(p, at::kFloat);
    at::Tensor buffer = s.exp_avg();
    buffer.lerp_(grad, 1 - momentum);
    updates[i] = options_.nesterov ? grad.lerp(buffer, momentum) : buffer.clone();
    release_state(p);
  }
  const std::vector<at::Tensor> directions = orthogonalised(updates);
  for (size_t i = 0; i < l.names.size(); ++i) {
    if (!updates[i].defined()) continue;
    at::Tensor p = l.params[i];
    p.mul_(1 - lr * decay);
    p.add_(directions[i].to(p.scalar_type()), -lr);
  }
  return loss;
}

}  // namespace hyperparallel::optim
