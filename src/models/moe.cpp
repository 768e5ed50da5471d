// Sparse MoE block and its auxiliary loss. See moe.h.
#include "moe.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "hyperparallel/fsdp/module_hooks.h"
#include "recompute.h"

namespace hyperparallel::models {

SparseMoeBlock::SparseMoeBlock(const ModelConfig& c, ParamFactory& factory)
    : FeedForwardModule(c.class_prefix() + "SparseMoeBlock"),
      num_experts(c.num_experts),
      top_k(c.num_experts_per_tok),
      norm_topk_prob(c.norm_topk_prob),
      local_count(c.num_experts) {
  gate = register_module("gate", std::make_shared<Linear>(c.hidden_size, c.num_experts, false, factory));
  experts = register_module("experts", std::make_shared<torch::nn::Module>("ModuleList"));
  for (int64_t e = 0; e < num_experts; ++e) {
    expert_mlps.push_back(std::make_shared<Mlp>(c.class_prefix() + "MLP", c.hidden_size, c.moe_intermediate_size, false, factory));
    experts->register_module(std::to_string(e), expert_mlps.back());
  }
}

void SparseMoeBlock::keep_experts(int64_t first, int64_t count) {
  for (int64_t e = 0; e < num_experts; ++e) {
    if (e >= first && e < first + count) continue;
    if (expert_mlps[static_cast<size_t>(e)]) experts->unregister_module(std::to_string(e));
    expert_mlps[static_cast<size_t>(e)] = nullptr;
  }
  first_local = first;
  local_count = count;
}

at::Tensor SparseMoeBlock::run_local_experts(const at::Tensor& grouped, const std::vector<int64_t>& counts) {
  return fsdp::hooked_forward(*experts, grouped, [&](const at::Tensor& rows) {
    // One split (its backward one concatenation), not a narrow per expert (whose backwards
    // would each write a zero-filled tensor of all the rows).
    std::vector<at::Tensor> outs = rows.split_with_sizes(counts, 0);
    for (int64_t l = 0; l < local_count; ++l) outs[static_cast<size_t>(l)] = (*expert(first_local + l))(outs[static_cast<size_t>(l)], nullptr);
    return at::cat(outs, 0);
  });
}

at::Tensor SparseMoeBlock::forward(const at::Tensor& x, std::vector<at::Tensor>* router_logits_out) {
  const auto shape = x.sizes().vec();
  const int64_t hidden = shape.back();
  const at::Tensor tokens = x.reshape({-1, hidden});
  const at::Tensor logits = gate->forward(tokens);
  at::Tensor weights = at::softmax(logits, 1, at::kFloat);
  auto [top_weights, selected] = at::topk(weights, top_k, -1);
  if (norm_topk_prob) top_weights = top_weights / top_weights.sum(-1, /*keepdim=*/true);
  top_weights = top_weights.to(x.scalar_type());
  if (router_logits_out) router_logits_out->push_back(logits);
  Routing routing{selected, top_weights, at::Tensor()};
  const bool counted = !recomputing();  // a recompute routes the same pairs again
  if (counted) routed_pairs += selected.numel();
  if (capacity_factor > 0) {
    routing.kept = pairs_within_capacity(selected, num_experts, capacity_factor);
    if (counted) dropped_pairs += selected.numel() - routing.kept.sum().item<int64_t>();
  }
  if (dispatch) return dispatch->combine(*this, tokens, routing).reshape(shape);
  // Inside `experts`' hooks, as the dispatch paths run them (FSDP may shard the experts).
  return fsdp::hooked_forward(*experts, tokens, [&](const at::Tensor& rows) { return loop_over_experts(rows, routing); })
      .reshape(shape);
}

at::Tensor SparseMoeBlock::loop_over_experts(const at::Tensor& tokens, const Routing& routing) {
  const at::Tensor& selected = routing.selected;
  const at::Tensor& top_weights = routing.weights;
  at::Tensor out = at::zeros_like(tokens);
  // expert_mask [experts, k, tokens]; torch.where order: by slot, then token.
  at::Tensor pair_mask = at::one_hot(selected, num_experts);
  if (routing.kept.defined()) pair_mask = pair_mask * routing.kept.unsqueeze(-1).to(pair_mask.scalar_type());
  const at::Tensor expert_mask = pair_mask.permute({2, 1, 0});
  for (int64_t e = 0; e < num_experts; ++e) {
    const auto where = at::where(expert_mask[e]);
    const at::Tensor& slot = where[0];
    const at::Tensor& token = where[1];
    // An expert without tokens still runs (on zero rows): every expert's parameters get a
    // gradient (zero) in every step, so which gradients exist — and with them the order in
    // which fully_shard's units complete and reduce-scatter — never depends on the routing.
    // A rank whose tokens skip an expert would otherwise hold its layer's reduce-scatter back
    // while its peers issue it, and the ranks' collectives would pair up wrongly.
    const at::Tensor expert_out =
        (*expert_mlps[e])(tokens.index_select(0, token), nullptr) * top_weights.index({token, slot}).unsqueeze(-1);
    out = out.index_add(0, token, expert_out.to(tokens.scalar_type()));
  }
  return out;
}

at::Tensor pairs_within_capacity(const at::Tensor& selected, int64_t num_experts, double factor) {
  const int64_t tokens = selected.size(0), k = selected.size(1), pairs = tokens * k;
  const double wanted = std::ceil(factor * static_cast<double>(pairs) / static_cast<double>(num_experts));
  const int64_t capacity = wanted >= static_cast<double>(pairs) ? pairs : static_cast<int64_t>(wanted);
  // Each pair's place among its expert's pairs in priority order (first choices first), from
  // one stable sort by expert: O(pairs) memory, no [pairs, experts] one-hot.
  const at::Tensor by_priority = selected.t().reshape({-1});
  const at::Tensor order = std::get<1>(at::sort(by_priority, c10::optional<bool>(true), /*dim=*/0));
  const at::Tensor counts = at::bincount(by_priority, {}, num_experts);
  const at::Tensor starts = counts.cumsum(0) - counts;
  const at::Tensor place_sorted = at::arange(pairs, at::kLong) - starts.index_select(0, by_priority.index_select(0, order));
  const at::Tensor place = at::empty_like(place_sorted).index_put_({order}, place_sorted);
  return place.lt(capacity).view({k, tokens}).t().contiguous();
}

RoutingSums routing_sums(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k, const at::Tensor& attention_mask) {
  const at::Tensor gate_logits = at::cat(router_logits, 0);
  const at::Tensor weights = at::softmax(gate_logits, -1);
  const at::Tensor selected = std::get<1>(at::topk(weights, top_k, -1));
  const at::Tensor expert_mask = at::one_hot(selected, num_experts).to(at::kFloat);  // [N, k, E]
  RoutingSums sums;
  if (!attention_mask.defined()) {
    sums.counts = expert_mask.sum(0);
    sums.prob_sums = weights.sum(0);
    sums.tokens = static_cast<double>(gate_logits.size(0));
    return sums;
  }
  const int64_t batch = attention_mask.size(0), seq = attention_mask.size(1);
  const int64_t layers = gate_logits.size(0) / (batch * seq);
  const at::Tensor mask = attention_mask.to(weights.scalar_type()).view({1, batch * seq}).expand({layers, batch * seq}).reshape({-1, 1});
  sums.counts = (expert_mask * mask.unsqueeze(-1)).sum(0);
  sums.prob_sums = (weights * mask).sum(0);
  sums.tokens = mask.sum().item<double>();
  return sums;
}

at::Tensor load_balancing_loss(const RoutingSums& sums, int64_t num_experts) {
  const double n = std::max(sums.tokens, 1.0);
  return ((sums.counts / n) * (sums.prob_sums / n).unsqueeze(0)).sum() * static_cast<double>(num_experts);
}

at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k,
                               const at::Tensor& attention_mask) {
  return load_balancing_loss(routing_sums(router_logits, num_experts, top_k, attention_mask), num_experts);
}

}  // namespace hyperparallel::models
