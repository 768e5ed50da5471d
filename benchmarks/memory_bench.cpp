// Activation memory and step time with activation checkpointing and chunked loss on the ~48 M Qwen3 of the
// model benchmark, one process, batch 4 x 512 tokens, AdamW:
//   plain        every activation kept
//   ac_full      every decoder layer checkpointed
//   ac_every2    layers 0, 2, 4, ... checkpointed
//   selective    every layer recomputed with its Linear outputs kept (the op policy)
//   selective_core  every layer's attention core (scores, softmax) recomputed
//   chunked      the loss on 512-token chunks (no whole [tokens x vocab] logits)
//   ac_chunked   ac_full and chunked
//   fused        plain with FusedAdamW (the baseline of offload)
//   offload      plain with FusedAdamW's moments in a file (MEMORY_BENCH_OFFLOAD_DIR, default the
//                working directory): `resident` then leaves the moments out
// Usage: memory_bench MODE STEPS [cached]. `cached` installs the caching host allocator the
// trainer uses (for step times: without it every step faults its activations in afresh; the
// memory columns then count the cache too). Prints one line:
//   RESULT mode=... step_ms=... resident_mb=... peak_mb=... activation_mb=...
// resident: the process after a warm-up step and malloc_trim (parameters, gradients, AdamW
// moments, the libraries);
// peak: the highest RSS over the measured steps (the kernel's high-water mark, reset after
// the warm-up through /proc/self/clear_refs); activation = peak - resident. Run each mode in
// its own process (docs/benchmarks.md "Memory").
#include <malloc.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "bench_common.h"
#include "bench_qwen3.h"
#include "hyperparallel/models/activation_checkpoint.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/optim/fused_adamw.h"

namespace hp = hyperparallel;

namespace {

constexpr int64_t kRows = 4, kSeq = 512;

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "plain";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 3;
  const bool cached = argc > 3 && std::string(argv[3]) == "cached";
  if (cached) hp::benchmarks::install_host_cache();
  const auto config = hp::benchmarks::qwen3_48m_config();
  hp::models::ModelLoadOptions options;
  options.seed = 1;
  auto model = hp::models::AutoModelForCausalLM::from_config(config, options);
  if (mode == "ac_full" || mode == "ac_chunked") hp::models::apply_activation_checkpointing(*model, {"full", 1});
  if (mode == "ac_every2") hp::models::apply_activation_checkpointing(*model, {"full", 2});
  if (mode == "selective") hp::models::apply_activation_checkpointing(*model, {"selective", 1});
  if (mode == "selective_core") hp::models::apply_activation_checkpointing(*model, {"selective", 1, false, "attention_core"});
  if (mode == "chunked" || mode == "ac_chunked") model->set_loss_chunk_tokens(512);
  std::unique_ptr<torch::optim::AdamW> optimizer;
  if (mode == "fused" || mode == "offload") {
    auto fused = std::make_unique<hp::optim::FusedAdamW>(model->parameters(), torch::optim::AdamWOptions(1e-4));
    const char* dir = std::getenv("MEMORY_BENCH_OFFLOAD_DIR");
    if (mode == "offload") fused->offload_state(dir ? dir : ".");
    optimizer = std::move(fused);
  } else {
    optimizer = std::make_unique<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(1e-4));
  }
  torch::optim::AdamW& opt = *optimizer;
  const auto step = [&](int s) {
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(100 + s));
    hp::models::CausalLMInput in;
    in.input_ids = at::randint(config.vocab_size, {kRows, kSeq}, gen, at::kLong);
    in.labels = in.input_ids;
    auto out = model->forward(in);
    opt.zero_grad();
    out.loss.backward();
    opt.step();
  };
  step(0);  // AdamW state and gradients exist from here on
  malloc_trim(0);  // hand back what the warm-up step freed, so `resident` is what stays
  const double resident = hp::benchmarks::status_mb("VmRSS");
  std::ofstream("/proc/self/clear_refs") << "5";  // reset the high-water mark
  std::vector<double> times;
  for (int s = 1; s <= steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    step(s);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  const double peak = hp::benchmarks::status_mb("VmHWM");
  std::printf("RESULT mode=%s%s step_ms=%.0f resident_mb=%.0f peak_mb=%.0f activation_mb=%.0f\n", mode.c_str(), cached ? " allocator=cached" : "",
              times[times.size() / 2] * 1e3, resident, peak, peak - resident);
  return 0;
}
