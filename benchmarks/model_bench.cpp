// Forward + backward throughput of a ~48 M-parameter Qwen3 on one rank, next to a matmul
// roofline measured in the same run, with and without the plan_overrides replacements
// (fused_qkv_attention, fused_rms_norm, fused_swiglu_mlp, all three). For docs/benchmarks.md ("Models").
//
// Model: vocab 32768, hidden 512, 10 layers, 8 heads of 64 (4 KV heads), MLP 1536, tied
// embeddings; batch 4 x 512 tokens. FLOPs per step count every matmul of forward and
// backward: 6 x tokens x (matmul parameters incl. the head) + 12 x layers x tokens x seq x
// heads x head_dim for attention scores and values (causal masking not discounted).
// The roofline is the best fp32 GEMM rate at the model's own shapes, measured again before
// every round of steps (the machine's speed drifts by +-10 % within minutes), and each step is
// set against the roofline of its round; the ratio says how much of the time goes to work
// other than large matmuls. Modes run interleaved (A B C D, A B C D, ...); each reports its
// median step and its median ratio. `--profile` then prints where one step of the reference
// and of all replacements goes, op by op (op_profile.h). `--bf16` adds the reference and all
// replacements with bfloat16 parameters and compute (what `bf16: true` runs after the
// all-gather), set against a bf16 roofline measured the same way; the fp32/bf16 step ratio is
// the bf16 speed-up (fast only where the CPU has AVX512_BF16: platform/bf16_matmul.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "bench_common.h"
#include "bench_qwen3.h"
#include "op_profile.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/platform/bf16_matmul.h"
#include "hyperparallel/platform/blas_check.h"
#include "models/attention.h"
#include "models/decoder.h"
#include "models/fused_attention.h"
#include "models/fused_rms_norm.h"
#include "models/fused_swiglu.h"
#include "models/rotary.h"

namespace hp = hyperparallel;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Best GFLOP/s of C = A B over the model's GEMM shapes (M tokens, K -> N features).
double matmul_roofline_gflops(int64_t tokens, int64_t hidden, int64_t inter, at::ScalarType dtype) {
  double best = 0;
  for (auto [k, n] : std::vector<std::pair<int64_t, int64_t>>{{hidden, inter}, {inter, hidden}, {hidden, 2 * hidden}}) {
    const at::Tensor a = at::randn({tokens, k}).to(dtype), b = at::randn({k, n}).to(dtype);
    at::Tensor c = at::mm(a, b);
    std::vector<double> times;
    for (int i = 0; i < 4; ++i) {
      const auto t = Clock::now();
      at::mm_out(c, a, b);
      times.push_back(seconds_since(t));
    }
    best = std::max(best, 2.0 * tokens * k * n / median(times) / 1e9);
  }
  return best;
}

// Median ms of `fn` (forward + backward of one module) over `reps` after one warm-up.
template <typename Fn>
double module_ms(Fn&& fn, int reps) {
  fn();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    const auto t = Clock::now();
    fn();
    times.push_back(seconds_since(t) * 1e3);
  }
  return median(times);
}

// Each replacement next to the module it replaces, forward + backward, at the benchmark
// model's sizes: the norm on [4, 512, 512] (fp32 and bf16), the MLP on 4 x 512 tokens (fp32 and bf16),
// attention on 2048 tokens as 4 x 512 and 1 x 2048.
void compare_modules(const hp::models::ModelConfig& c) {
  using namespace hp::models;
  ParamFactory factory(false, 1, 0.02, at::kFloat);
  std::printf("%-34s %12s %12s %8s\n", "module (forward + backward)", "reference_ms", "replaced_ms", "speedup");
  auto norm = std::make_shared<RMSNorm>("Qwen3RMSNorm", c.hidden_size, c.rms_norm_eps, factory);
  auto fused_norm = std::make_shared<FusedRMSNorm>(*norm);
  const at::Tensor x = at::randn({4, 512, c.hidden_size}).requires_grad_();
  const double ref_norm = module_ms([&] { norm->forward(x).sum().backward(); }, 21);
  const double new_norm = module_ms([&] { fused_norm->forward(x).sum().backward(); }, 21);
  std::printf("%-34s %12.2f %12.2f %7.2fx\n", "Qwen3RMSNorm -> fused_rms_norm", ref_norm, new_norm, ref_norm / new_norm);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const std::string in = dtype == at::kFloat ? "" : " (bf16)";
    ParamFactory typed(false, 1, 0.02, dtype);
    auto mlp = std::make_shared<Mlp>("Qwen3MLP", c.hidden_size, c.intermediate_size, false, typed);
    auto fused_mlp = std::make_shared<FusedSwiGLUMlp>(*mlp);
    const at::Tensor h = at::randn({4, 512, c.hidden_size}).to(dtype).requires_grad_();
    const double ref_mlp = module_ms([&] { mlp->forward(h).sum().backward(); }, 11);
    const double new_mlp = module_ms([&] { fused_mlp->forward(h).sum().backward(); }, 11);
    std::printf("%-34s %12.2f %12.2f %7.2fx\n", ("Qwen3MLP -> fused_swiglu_mlp" + in).c_str(), ref_mlp, new_mlp, ref_mlp / new_mlp);
    if (dtype == at::kFloat) continue;
    auto typed_norm = std::make_shared<RMSNorm>("Qwen3RMSNorm", c.hidden_size, c.rms_norm_eps, typed);
    auto typed_fused_norm = std::make_shared<FusedRMSNorm>(*typed_norm);
    const double ref = module_ms([&] { typed_norm->forward(h).sum().backward(); }, 21);
    const double fused = module_ms([&] { typed_fused_norm->forward(h).sum().backward(); }, 21);
    std::printf("%-34s %12.2f %12.2f %7.2fx\n", ("Qwen3RMSNorm -> fused_rms_norm" + in).c_str(), ref, fused, ref / fused);
  }
  auto attention = std::make_shared<Attention>(c, factory);
  auto fused_attention = std::make_shared<FusedQKVAttention>(*attention);
  for (int64_t seq : {512, 2048}) {
    const int64_t batch = 2048 / seq;
    const at::Tensor h = at::randn({batch, seq, c.hidden_size}).requires_grad_();
    AttentionInputs in;
    std::tie(in.cos, in.sin) =
        rope_cos_sin(rope_inv_freq(c), at::arange(seq).view({1, seq}).expand({batch, seq}), at::kFloat);
    in.mask = build_attention_mask(batch, seq, at::Tensor(), at::Tensor(), false, at::kFloat);
    const double ref = module_ms([&] { attention->forward(h, in).sum().backward(); }, 5);
    const double fused = module_ms([&] { fused_attention->forward(h, in).sum().backward(); }, 5);
    const std::string name = "Qwen3Attention -> fused_qkv (T=" + std::to_string(seq) + ")";
    std::printf("%-34s %12.2f %12.2f %7.2fx\n", name.c_str(), ref, fused, ref / fused);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 6;
  // Without it every step pays page faults for its temporaries (host_allocator.h).
  bool cache = true, profile = false, bf16 = false;
  for (int i = 2; i < argc; ++i) {
    cache = cache && std::string(argv[i]) != "--no-host-cache";
    profile = profile || std::string(argv[i]) == "--profile";
    bf16 = bf16 || std::string(argv[i]) == "--bf16";
  }
  if (cache) hp::benchmarks::install_host_cache();
  hp::platform::configure_compute_threads();
  const hp::models::ModelConfig c = hp::benchmarks::qwen3_48m_config();
  constexpr int64_t kBatch = 4, kSeq = 512;
  const int64_t tokens = kBatch * kSeq;

  hp::models::ModelLoadOptions plain;
  plain.seed = 1;
  const hp::models::PlanOverride attention{"*.self_attn", "Qwen3Attention", "fused_qkv_attention"};
  const hp::models::PlanOverride norm{"*", "Qwen3RMSNorm", "fused_rms_norm"};
  struct Mode {
    std::string name;
    std::vector<hp::models::PlanOverride> overrides;
    at::ScalarType dtype = at::kFloat;
  };
  const hp::models::PlanOverride mlp{"*.mlp", "Qwen3MLP", "fused_swiglu_mlp"};
  std::vector<Mode> mode_list{{"reference", {}},
                              {"fused_qkv_attention", {attention}},
                              {"fused_rms_norm", {norm}},
                              {"fused_swiglu_mlp", {mlp}},
                              {"all", {attention, norm, mlp}}};
  if (bf16) {
    mode_list.push_back({"reference_bf16", {}, at::kBFloat16});
    mode_list.push_back({"all_bf16", {attention, norm, mlp}, at::kBFloat16});
  }
  std::vector<std::pair<std::string, std::shared_ptr<hp::models::CausalLM>>> modes;
  for (const Mode& mode : mode_list) {
    hp::models::ModelLoadOptions options = plain;
    options.plan_overrides = mode.overrides;
    options.dtype = mode.dtype;
    modes.emplace_back(mode.name, hp::models::AutoModelForCausalLM::from_config(c, options));
  }

  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const double matmul_params = c.num_hidden_layers * (c.hidden_size * (2 * q + 2 * kv) + 3.0 * c.hidden_size * c.intermediate_size) +
                               static_cast<double>(c.vocab_size) * c.hidden_size;
  const double flops = 6.0 * tokens * matmul_params + 12.0 * c.num_hidden_layers * tokens * kSeq * q;

  auto gen = at::detail::createCPUGenerator(3);
  hp::models::CausalLMInput in;
  in.input_ids = at::randint(c.vocab_size, {kBatch, kSeq}, gen, at::kLong);
  in.labels = in.input_ids;
  std::vector<std::vector<double>> times(modes.size()), ratios(modes.size());
  std::vector<double> rooflines, bf16_rooflines, losses(modes.size());
  for (int s = 0; s < steps + 2; ++s) {
    const double roofline = matmul_roofline_gflops(tokens, c.hidden_size, c.intermediate_size, at::kFloat);
    const double bf16_roofline = bf16 ? matmul_roofline_gflops(tokens, c.hidden_size, c.intermediate_size, at::kBFloat16) : 0;
    for (size_t m = 0; m < modes.size(); ++m) {
      auto& model = *modes[m].second;
      model.zero_grad();
      const auto t = Clock::now();
      const at::Tensor loss = model.forward(in).loss;
      loss.backward();
      const double step = seconds_since(t);
      if (s == 0) losses[m] = loss.item<double>();
      if (s < 2) continue;  // steps 0 and 1 warm up (and fill the host cache)
      times[m].push_back(step);
      ratios[m].push_back(flops / step / 1e9 / (mode_list[m].dtype == at::kFloat ? roofline : bf16_roofline));
    }
    if (s >= 2) rooflines.push_back(roofline);
    if (s >= 2 && bf16) bf16_rooflines.push_back(bf16_roofline);
  }
  std::printf("model: Qwen3 %.1f M parameters, batch %ld x %ld, %d threads, %.1f GFLOP per step\n",
              c.parameter_count() / 1e6, static_cast<long>(kBatch), static_cast<long>(kSeq), at::get_num_threads(), flops / 1e9);
  const hp::platform::BlasInfo blas = hp::platform::loaded_blas();
  std::printf("host allocation cache: %s, blas: %s (%s kernels)\n", cache ? "on" : "off",
              blas.path.empty() ? "LibTorch's own" : blas.path.c_str(), blas.kernels.c_str());
  std::vector<double> sorted = rooflines;
  std::sort(sorted.begin(), sorted.end());
  std::printf("matmul roofline (best fp32 GEMM at the model's shapes), per round: median %.1f, range %.1f-%.1f GFLOP/s\n",
              median(rooflines), sorted.front(), sorted.back());
  if (bf16) {
    std::printf("bf16 matmul roofline (best bf16 GEMM, same shapes), per round: median %.1f GFLOP/s; bf16 matmul accumulates in %s\n",
                median(bf16_rooflines), hp::platform::bf16_matmul_accumulates_in_fp32() ? "fp32" : "bf16");
  }
  std::printf("%-20s %10s %12s %10s %14s %12s\n", "mode", "step_ms", "tokens/s", "GFLOP/s", "of_roofline", "first_loss");
  for (size_t m = 0; m < modes.size(); ++m) {
    const double step = median(times[m]);
    std::printf("%-20s %10.1f %12.0f %10.1f %13.1f%% %12.6f\n", modes[m].first.c_str(), step * 1e3, tokens / step, flops / step / 1e9,
                100.0 * median(ratios[m]), losses[m]);
  }
  if (bf16) {
    const auto step_of = [&](const std::string& name) {
      for (size_t m = 0; m < modes.size(); ++m) {
        if (modes[m].first == name) return median(times[m]);
      }
      return 0.0;
    };
    std::printf("bf16 speed-up (fp32 step / bf16 step): reference %.2fx, all %.2fx\n", step_of("reference") / step_of("reference_bf16"),
                step_of("all") / step_of("all_bf16"));
  }
  compare_modules(c);
  // The reference and all replacements, op by op.
  for (const size_t m : profile ? std::vector<size_t>{0, modes.size() - 1} : std::vector<size_t>{}) {
    auto& model = *modes[m].second;
    model.zero_grad();
    hp::benchmarks::print_op_profile(modes[m].first.c_str(), [&] { model.forward(in).loss.backward(); });
  }
  return 0;
}
