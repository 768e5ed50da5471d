// Stage splits. See pp/stage_split.h.
#include "hyperparallel/pp/stage_split.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::pp {

namespace {

std::vector<models::ModelSpan> spans_from_counts(const std::vector<int64_t>& counts) {
  std::vector<models::ModelSpan> split;
  int64_t next = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    models::ModelSpan span;
    span.layer_begin = next;
    span.layer_end = next += counts[s];
    span.embedding = s == 0;
    span.head = s + 1 == counts.size();
    split.push_back(span);
  }
  return split;
}

// "a-b" or "a" (inclusive); -1 on anything else.
std::pair<int64_t, int64_t> parse_range(std::string text) {
  text.erase(std::remove_if(text.begin(), text.end(), [](unsigned char c) { return std::isspace(c); }), text.end());
  const size_t dash = text.find('-');
  const auto number = [](const std::string& t) -> int64_t {
    if (t.empty() || t.size() > 9 || !std::all_of(t.begin(), t.end(), [](unsigned char c) { return std::isdigit(c); })) return -1;
    return std::stoll(t);
  };
  if (dash == std::string::npos) {
    const int64_t one = number(text);
    return {one, one};
  }
  return {number(text.substr(0, dash)), number(text.substr(dash + 1))};
}

}  // namespace

std::vector<models::ModelSpan> balanced_split(int64_t layers, int64_t stages) {
  if (stages < 1 || layers < 1 || layers + 2 < stages) {
    throw UserError("pipeline: " + std::to_string(stages) + " stages cannot split " + std::to_string(layers) +
                    " layers (each stage needs a layer, the first and last may hold just the embedding or the head): use at most " +
                    std::to_string(layers + 2) + " stages (pp_size x pp_virtual_stages)");
  }
  const int64_t pieces = layers + 2, base = pieces / stages;
  std::vector<int64_t> size(static_cast<size_t>(stages), base);
  // The remainder to the middle stages first, then the ends.
  std::vector<int64_t> order;
  for (int64_t s = 1; s + 1 < stages; ++s) order.push_back(s);
  order.push_back(0);
  if (stages > 1) order.push_back(stages - 1);
  for (int64_t k = 0; k < pieces % stages; ++k) ++size[static_cast<size_t>(order[static_cast<size_t>(k)])];
  std::vector<int64_t> counts = size;
  counts.front() -= 1;  // the embedding
  counts.back() -= 1;   // the head
  return spans_from_counts(counts);
}

std::vector<models::ModelSpan> explicit_split(const std::vector<std::string>& ranges, int64_t layers, int64_t stages) {
  if (static_cast<int64_t>(ranges.size()) != stages) {
    throw UserError("pipeline: pp_layers lists " + std::to_string(ranges.size()) + " ranges for " + std::to_string(stages) +
                    " stages (pp_size x pp_virtual_stages); give one range per stage, e.g. [0-3, 4-7]");
  }
  std::vector<int64_t> counts;
  int64_t next = 0;
  for (const std::string& text : ranges) {
    const auto [first, last] = parse_range(text);
    if (first < 0 || last < first) {
      throw UserError("pipeline: pp_layers range '" + text + "' is not a layer range like 0-7 or 5 (first <= last)");
    }
    if (first != next || last >= layers) {
      throw UserError("pipeline: pp_layers range '" + text + "' should start at layer " + std::to_string(next) +
                      (last >= layers ? " and end before layer " + std::to_string(layers) : std::string()) +
                      ": the ranges cover layers 0.." + std::to_string(layers - 1) + " once, in order");
    }
    counts.push_back(last - first + 1);
    next = last + 1;
  }
  if (next != layers) {
    throw UserError("pipeline: pp_layers ends at layer " + std::to_string(next - 1) + "; the model has " + std::to_string(layers) +
                    " layers (0.." + std::to_string(layers - 1) + ")");
  }
  return spans_from_counts(counts);
}

std::string to_string(const std::vector<models::ModelSpan>& split) {
  std::ostringstream out;
  for (size_t s = 0; s < split.size(); ++s) {
    if (s) out << ", ";
    if (split[s].layer_end == split[s].layer_begin) {
      out << "none";
    } else {
      out << split[s].layer_begin << "-" << split[s].layer_end - 1;
    }
  }
  return out.str();
}

std::vector<int64_t> stages_of_rank(int64_t rank, int64_t ranks, int64_t virtual_stages) {
  std::vector<int64_t> stages;
  for (int64_t v = 0; v < virtual_stages; ++v) stages.push_back(rank + v * ranks);
  return stages;
}

void keep_stages(models::CausalLM& model, const std::vector<models::ModelSpan>& split, int64_t rank, int64_t ranks) {
  bool embedding = false, head = false;
  std::vector<int64_t> layers;
  for (size_t s = static_cast<size_t>(rank); s < split.size(); s += static_cast<size_t>(ranks)) {
    embedding = embedding || split[s].embedding;
    head = head || split[s].head;
    for (int64_t l = split[s].layer_begin; l < split[s].layer_end; ++l) layers.push_back(l);
  }
  model.keep_only(embedding, layers, head);
}

ActionCosts layer_costs(const models::ModelConfig& c, int64_t sequence_length) {
  const double h = static_cast<double>(c.hidden_size);
  const double head = static_cast<double>(c.head_dim > 0 ? c.head_dim : c.hidden_size / std::max<int64_t>(c.num_attention_heads, 1));
  const double q = head * static_cast<double>(c.num_attention_heads);
  const double kv = head * static_cast<double>(c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads);
  const double mlp = c.num_experts > 0
                         ? 3 * h * static_cast<double>(c.moe_intermediate_size * c.num_experts_per_tok) + h * static_cast<double>(c.num_experts)
                         : 3 * h * static_cast<double>(c.intermediate_size);
  const double gemms = 2 * (h * (q + 2 * kv) + q * h + mlp);
  const double attention = 4 * static_cast<double>(std::max<int64_t>(sequence_length, 1)) * q;
  const double forward = gemms + attention;
  ActionCosts costs;
  costs.forward = 1;
  costs.backward_input = (gemms + 2 * attention) / forward;
  costs.backward_weight = gemms / forward;
  costs.backward = costs.backward_input + costs.backward_weight;
  return costs;
}

}  // namespace hyperparallel::pp
