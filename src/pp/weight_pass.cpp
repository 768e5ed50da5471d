// Zero-bubble's weight pass from captured junction gradients. See weight_pass.h.
#include "weight_pass.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

namespace hyperparallel::pp {
namespace {

using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::variable_list;

// The graph below a segment's outputs, with each node's parents (the nodes whose edges reach it).
struct Graph {
  std::unordered_map<Node*, std::vector<Node*>> parents;  // every node reached, roots included
  std::unordered_map<Node*, std::shared_ptr<Node>> owners;
  std::unordered_set<Node*> roots;  // the outputs' grad_fns

  bool contains(Node* n) const { return parents.count(n) > 0; }
};

// Depth first from `starts`, each node once: `expand(n, push)` is called for every node taken
// and calls push(m) for the nodes to go on to. Returns every node pushed (the starts too).
template <class Expand>
std::unordered_set<Node*> depth_first(const std::vector<Node*>& starts, Expand expand) {
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  const auto push = [&](Node* n) {
    if (seen.insert(n).second) stack.push_back(n);
  };
  for (Node* n : starts) push(n);
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    expand(n, push);
  }
  return seen;
}

Graph read_graph(const std::vector<at::Tensor>& outputs) {
  Graph g;
  std::vector<Node*> starts;
  for (const auto& o : outputs) {
    if (!o.defined() || !o.requires_grad() || !o.grad_fn()) continue;
    Node* n = o.grad_fn().get();
    g.roots.insert(n);
    g.owners[n] = o.grad_fn();
    g.parents[n];
    starts.push_back(n);
  }
  depth_first(starts, [&](Node* n, const auto& push) {
    for (const Edge& e : n->next_edges()) {
      if (!e.function) continue;
      g.parents[e.function.get()].push_back(n);
      g.owners.emplace(e.function.get(), e.function);
      push(e.function.get());
    }
  });
  return g;
}

// Where a tensor's gradient enters the graph: its accumulator (a leaf) or its grad_fn.
Node* gradient_node(const at::Tensor& t) {
  if (t.grad_fn()) return t.grad_fn().get();
  return torch::autograd::impl::try_get_grad_accumulator(t).get();
}

// The nodes from which `input`'s gradient node is reachable: the input gradient's path.
std::unordered_set<Node*> input_path(const Graph& g, const at::Tensor& input) {
  Node* start = input.defined() ? gradient_node(input) : nullptr;
  if (!start || !g.contains(start)) return {};
  return depth_first({start}, [&](Node* n, const auto& push) {
    for (Node* p : g.parents.at(n)) push(p);
  });
}

// A parameter's junctions: walking up from its gradient node, the first nodes on the input
// path. `reaches_output` is set when the walk meets an output off that path (its gradient
// enters there, where no junction sees it).
std::vector<Node*> junctions_of(const Graph& g, const std::unordered_set<Node*>& path, Node* param, bool& reaches_output) {
  std::vector<Node*> found;
  depth_first({param}, [&](Node* n, const auto& push) {
    if (path.count(n)) {  // a junction: the walk stops here
      found.push_back(n);
      return;
    }
    if (g.roots.count(n)) reaches_output = true;
    for (Node* p : g.parents.at(n)) push(p);
  });
  return found;
}

// Whether a junction reaches another of `junctions` (along the input path, the only way one can).
bool junctions_chain(const std::vector<Node*>& junctions, const std::unordered_set<Node*>& path) {
  const std::unordered_set<Node*> targets(junctions.begin(), junctions.end());
  for (Node* start : junctions) {
    bool chained = false;
    depth_first({start}, [&](Node* n, const auto& push) {
      if (chained) return;  // found: walk no further
      for (const Edge& e : n->next_edges()) {
        Node* c = e.function.get();
        if (!c || !path.count(c)) continue;
        chained = chained || targets.count(c) > 0;
        push(c);
      }
    });
    if (chained) return true;
  }
  return false;
}

// Keeps the gradients a node receives each time it runs.
struct CaptureInputs final : torch::autograd::FunctionPostHook {
  explicit CaptureInputs(std::shared_ptr<variable_list> into) : into_(std::move(into)) {}
  variable_list operator()(const variable_list& outputs, const variable_list& inputs) override {
    *into_ = inputs;
    return outputs;
  }
  std::shared_ptr<variable_list> into_;
};

struct BodyNode final : Node {
  explicit BodyNode(const std::function<void()>& body) : body_(body) {}
  variable_list apply(variable_list&&) override {
    body_();
    return {};
  }
  std::string name() const override { return "hyperparallel::pp::WeightPass"; }
  const std::function<void()>& body_;
};

// Runs a node's hooks on gradients arriving at it, in the engine's order: the tensor hooks
// (Tensor::register_hook, retain_grad), then the node's own pre hooks.
variable_list run_pre_hooks(Node& node, variable_list values) {
  for (const auto& hook : node.tensor_pre_hooks()) values = (*hook)(values);
  for (const auto& [index, hook] : node.retains_grad_hooks()) values = (*hook)(values);
  for (const auto& hook : node.pre_hooks()) values = (*hook)(values);
  return values;
}

bool has_pre_hooks(Node& node) {
  return !node.tensor_pre_hooks().empty() || !node.retains_grad_hooks().empty() || !node.pre_hooks().empty();
}

// Calls the gradient hooks registered on `outputs` (Tensor::register_hook: tensor pre hooks
// of their grad_fn) as autograd does when `grads` arrive there, without running their nodes.
void fire_output_hooks(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& grads) {
  std::vector<std::pair<std::shared_ptr<Node>, variable_list>> arriving;  // per node, in output order
  for (size_t o = 0; o < outputs.size() && o < grads.size(); ++o) {
    const at::Tensor& t = outputs[o];
    if (!t.defined() || !t.requires_grad() || !t.grad_fn() || !grads[o].defined()) continue;
    auto it = std::find_if(arriving.begin(), arriving.end(), [&](const auto& a) { return a.first == t.grad_fn(); });
    if (it == arriving.end()) {
      arriving.emplace_back(t.grad_fn(), variable_list(t.grad_fn()->num_inputs()));
      it = std::prev(arriving.end());
    }
    it->second[t.output_nr()] = grads[o];
  }
  for (auto& [node, values] : arriving) run_pre_hooks(*node, std::move(values));
}

// Union-find over parameter indices.
int64_t find(std::vector<int64_t>& up, int64_t i) {
  while (up[i] != i) i = up[i] = up[up[i]];
  return i;
}

}  // namespace

// A node whose incoming gradients I keeps for W (a post hook, removed after I).
struct SegmentWeights::Capture {
  std::shared_ptr<Node> node;
  std::shared_ptr<variable_list> grads = std::make_shared<variable_list>();
  uintptr_t hook = 0;

  void attach() { hook = node->add_post_hook(std::make_unique<CaptureInputs>(grads)); }
  void detach() {
    if (hook) node->del_post_hook(hook);
    hook = 0;
  }
};

struct SegmentWeights::Group {
  std::vector<at::Tensor> params;
  std::vector<Edge> param_edges;
  std::vector<Capture> junctions;  // in the order autograd made them
  bool replay = false;
};

namespace {

// What the constructor learns of each parameter it finds in the graph.
struct ParamJunctions {
  at::Tensor param;
  Node* node;
  std::vector<Node*> junctions;
  bool replay;
};

std::vector<ParamJunctions> find_junctions(const Graph& g, const std::unordered_set<Node*>& path, const std::vector<at::Tensor>& params) {
  std::vector<ParamJunctions> found;
  for (const auto& p : params) {
    Node* n = p.requires_grad() ? gradient_node(p) : nullptr;
    const bool seen = std::any_of(found.begin(), found.end(), [&](const ParamJunctions& f) { return f.node == n; });
    if (!n || !g.contains(n) || seen) continue;
    bool reaches_output = false;
    std::vector<Node*> junctions = junctions_of(g, path, n, reaches_output);
    const bool replay = reaches_output || junctions.empty();
    found.push_back({p, n, std::move(junctions), replay});
  }
  return found;
}

// The union-find root of each parameter, parameters joined where they share a junction.
std::vector<int64_t> join_shared_junctions(const std::vector<ParamJunctions>& found) {
  std::vector<int64_t> up(found.size());
  std::iota(up.begin(), up.end(), 0);
  std::unordered_map<Node*, int64_t> claimed;
  for (int64_t i = 0; i < static_cast<int64_t>(found.size()); ++i) {
    for (Node* j : found[i].junctions) {
      auto [it, fresh] = claimed.emplace(j, i);
      if (!fresh) up[find(up, i)] = find(up, it->second);
    }
  }
  for (int64_t i = 0; i < static_cast<int64_t>(found.size()); ++i) up[i] = find(up, i);
  return up;
}

// Gradient hooks inside the segment (FSDP's on a unit that is part of a layer, e.g. MoE's
// experts under expert parallelism) sit on input-path nodes that W does not run (not an
// output, not a junction W starts at): those nodes, last made first (backward's order).
std::vector<std::shared_ptr<Node>> hooked_nodes(const Graph& g, const std::unordered_set<Node*>& path,
                                                const std::unordered_set<Node*>& started) {
  std::vector<std::shared_ptr<Node>> hooked;
  for (Node* n : path) {
    if (has_pre_hooks(*n) && !g.roots.count(n) && !started.count(n)) hooked.push_back(g.owners.at(n));
  }
  std::sort(hooked.begin(), hooked.end(), [](const auto& a, const auto& b) { return a->sequence_nr() > b->sequence_nr(); });
  return hooked;
}

}  // namespace

SegmentWeights::SegmentWeights(const std::vector<at::Tensor>& outputs, const at::Tensor& input, const std::vector<at::Tensor>& params)
    : outputs_(outputs) {
  const Graph g = read_graph(outputs);
  const std::unordered_set<Node*> path = input_path(g, input);
  const std::vector<ParamJunctions> found = find_junctions(g, path, params);
  const std::vector<int64_t> root = join_shared_junctions(found);
  std::unordered_map<int64_t, size_t> group_of;  // union-find root -> index in groups_
  for (size_t i = 0; i < found.size(); ++i) {
    auto [it, fresh] = group_of.emplace(root[i], groups_.size());
    if (fresh) groups_.emplace_back();
    Group& group = groups_[it->second];
    group.params.push_back(found[i].param);
    group.param_edges.emplace_back(g.owners.at(found[i].node), found[i].param.grad_fn() ? found[i].param.output_nr() : 0);
    group.replay = group.replay || found[i].replay;
    for (Node* j : found[i].junctions) {
      const bool known = std::any_of(group.junctions.begin(), group.junctions.end(), [&](const Capture& c) { return c.node.get() == j; });
      if (!known) group.junctions.push_back({g.owners.at(j)});
    }
  }
  std::unordered_set<Node*> started;  // the direct groups' junctions: W runs them, hooks included
  for (Group& group : groups_) {
    std::sort(group.junctions.begin(), group.junctions.end(),
              [](const Capture& a, const Capture& b) { return a.node->sequence_nr() < b.node->sequence_nr(); });
    if (!group.replay && group.junctions.size() > 1) {
      std::vector<Node*> js;
      for (const auto& j : group.junctions) js.push_back(j.node.get());
      group.replay = junctions_chain(js, path);
    }
    if (group.replay) group.junctions.clear();
    for (auto& j : group.junctions) {
      j.attach();
      started.insert(j.node.get());
    }
  }
  for (auto& node : hooked_nodes(g, path, started)) {
    hooked_.push_back({node});
    hooked_.back().attach();
  }
}

SegmentWeights::~SegmentWeights() { stop_capture(); }
SegmentWeights::SegmentWeights(SegmentWeights&&) noexcept = default;

void SegmentWeights::stop_capture() {
  for (Group& group : groups_) {
    for (auto& j : group.junctions) j.detach();
  }
  for (auto& h : hooked_) h.detach();
}

void SegmentWeights::accumulate(const std::vector<at::Tensor>& output_grads) {
  stop_capture();
  if (direct_groups() > 0) {  // a replay fires the hooks on its way (before: every group replays)
    fire_output_hooks(outputs_, output_grads);
    for (auto& h : hooked_) {
      run_pre_hooks(*h.node, h.grads->empty() ? variable_list(h.node->num_inputs()) : *h.grads);
      h.grads->clear();
    }
  }
  std::vector<at::Tensor> replayed;
  for (Group& group : groups_) {
    if (group.replay) {
      replayed.insert(replayed.end(), group.params.begin(), group.params.end());
      continue;
    }
    run_from_junctions(group);
  }
  if (!replayed.empty()) replay(replayed, output_grads);
}

void SegmentWeights::run_from_junctions(Group& group) {
  torch::autograd::edge_list roots;
  variable_list grads;
  for (auto& j : group.junctions) {
    for (size_t i = 0; i < j.grads->size(); ++i) {
      if (!(*j.grads)[i].defined()) continue;
      roots.emplace_back(j.node, static_cast<uint32_t>(i));
      grads.push_back((*j.grads)[i]);
    }
    j.grads->clear();
  }
  if (roots.empty()) return;  // no gradient reached the junctions: nothing to add
  torch::autograd::Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/true, /*create_graph=*/false,
                                                        /*accumulate_grad=*/true, group.param_edges);
}

void SegmentWeights::replay(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& output_grads) {
  std::vector<at::Tensor> roots, grads;
  for (size_t o = 0; o < outputs_.size() && o < output_grads.size(); ++o) {
    if (!outputs_[o].defined() || !outputs_[o].requires_grad() || !output_grads[o].defined()) continue;
    roots.push_back(outputs_[o]);
    grads.push_back(output_grads[o]);
  }
  if (!roots.empty()) torch::autograd::backward(roots, grads, /*retain_graph=*/true, false, params);
}

int64_t SegmentWeights::direct_groups() const {
  return std::count_if(groups_.begin(), groups_.end(), [](const Group& g) { return !g.replay; });
}

int64_t SegmentWeights::replayed_groups() const {
  return std::count_if(groups_.begin(), groups_.end(), [](const Group& g) { return g.replay; });
}

void run_as_one_backward(const std::function<void()>& body) {
  auto node = std::make_shared<BodyNode>(body);
  const at::Tensor seed = at::zeros({1});
  node->add_input_metadata(seed);
  torch::autograd::Engine::get_default_engine().execute({Edge(node, 0)}, {seed}, /*keep_graph=*/false, /*create_graph=*/false,
                                                        /*accumulate_grad=*/true);
}


}  // namespace hyperparallel::pp
