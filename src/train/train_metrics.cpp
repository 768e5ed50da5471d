// Speed accounting of a training run. See train_metrics.h.
#include "train_metrics.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace hyperparallel::train {

double training_flops_per_token(const models::ModelConfig& c, double mean_sequence_length) {
  const double hidden = static_cast<double>(c.hidden_size);
  const double q = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim);
  double weights = static_cast<double>(c.vocab_size) * hidden;  // the head
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    weights += hidden * (q + 2 * kv) + q * hidden;
    weights += c.is_moe_layer(layer) ? static_cast<double>(c.num_experts_per_tok) * 3 * hidden * static_cast<double>(c.moe_intermediate_size) +
                                           hidden * static_cast<double>(c.num_experts)
                                     : 3 * hidden * static_cast<double>(c.intermediate_size);
  }
  return 6 * weights + 12 * static_cast<double>(c.num_hidden_layers) * q * mean_sequence_length;
}

double measure_matmul_gflops(const models::ModelConfig& c) {
  using Clock = std::chrono::steady_clock;
  constexpr int64_t kTokens = 256;
  const int64_t hidden = c.hidden_size;
  const int64_t inter = c.num_experts > 0 ? c.moe_intermediate_size : c.intermediate_size;
  double best = 0;
  for (auto [k, n] : std::vector<std::pair<int64_t, int64_t>>{{hidden, inter}, {inter, hidden}, {hidden, hidden}}) {
    const at::Tensor a = at::randn({kTokens, k}), b = at::randn({k, n});
    at::Tensor out = at::mm(a, b);  // warm-up
    for (int i = 0; i < 3; ++i) {
      const auto t = Clock::now();
      at::mm_out(out, a, b);
      const double s = std::chrono::duration<double>(Clock::now() - t).count();
      if (s > 0) best = std::max(best, 2.0 * static_cast<double>(kTokens * k * n) / s / 1e9);
    }
  }
  return best;
}

std::string timedelta_text(double seconds) {
  const int64_t total = std::max<int64_t>(0, static_cast<int64_t>(seconds));
  const int64_t days = total / 86400, rest = total % 86400;
  char text[64];
  std::snprintf(text, sizeof(text), "%lld:%02lld:%02lld", static_cast<long long>(rest / 3600), static_cast<long long>(rest % 3600 / 60),
                static_cast<long long>(rest % 60));
  if (days == 0) return text;
  return std::to_string(days) + (days == 1 ? " day, " : " days, ") + text;
}

}  // namespace hyperparallel::train
