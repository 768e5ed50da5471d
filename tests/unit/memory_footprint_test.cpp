// Measured memory of the memory features on a ~50 M Qwen3, each mode in its own process.
//
// MemoryFootprint runs this binary again once per mode, with HP_MEMORY_FOOTPRINT_MODE set, so
// that MemoryFootprintChild trains one step there and prints what it measured:
//   resident   the process after a warm-up step and malloc_trim (parameters, gradients,
//              FusedAdamW's moments, the libraries);
//   activation the next step's RSS high-water mark (reset through /proc/self/clear_refs)
//              minus resident: what the step's activations and their gradients took.
// glibc's allocator with fixed mmap and trim thresholds, no caching allocator: freed memory
// goes back, so the high-water mark is the step's own. The model (vocab 16384, hidden 512,
// 14 layers, 8 heads, intermediate 1536; 52 M parameters) keeps the layers' activations the
// larger term and the logits a visible one.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "hyperparallel/models/activation_checkpoint.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/optim/fused_adamw.h"
#include "support/multiprocess.h"
#include "support/process_status.h"
#include "support/subprocess.h"
#include "support/trainer_runs.h"

namespace hyperparallel {
namespace {

constexpr int64_t kRows = 2, kSeq = 512, kVocab = 16384, kChunk = 128;

models::ModelConfig footprint_config() {
  models::ModelConfig c = models::debug_flavour_config("qwen3-debug");
  c.vocab_size = kVocab;
  c.hidden_size = 512;
  c.num_hidden_layers = 14;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  c.intermediate_size = 1536;
  return c;
}

TEST(MemoryFootprintChild, OneStep) {
  const char* env_mode = std::getenv("HP_MEMORY_FOOTPRINT_MODE");
  if (!env_mode) GTEST_SKIP() << "run by MemoryFootprint with HP_MEMORY_FOOTPRINT_MODE set";
  const std::string mode = env_mode;
  // Fixed thresholds: glibc otherwise raises them as large blocks are freed, and the peak then
  // depends on allocation order. Every tensor of note is its own mapping, returned when freed.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  mallopt(M_TRIM_THRESHOLD, 128 * 1024);
  models::ModelLoadOptions options;
  options.seed = 1;
  auto model = models::AutoModelForCausalLM::from_config(footprint_config(), options);
  if (mode == "full" || mode == "full_chunked") models::apply_activation_checkpointing(*model, {"full", 1});
  if (mode == "selective") models::apply_activation_checkpointing(*model, {"selective", 1});
  if (mode == "selective_core") models::apply_activation_checkpointing(*model, {"selective", 1, false, "attention_core"});
  if (mode == "chunked" || mode == "full_chunked") model->set_loss_chunk_tokens(kChunk);
  optim::FusedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-4));
  if (mode == "offload") optimizer.offload_state(std::getenv("HP_MEMORY_FOOTPRINT_DIR"));
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  const auto step = [&](uint64_t seed) {
    auto gen = at::detail::createCPUGenerator(seed);
    models::CausalLMInput in;
    in.input_ids = at::randint(kVocab, {kRows, kSeq}, gen, at::kLong);
    in.labels = in.input_ids;
    auto out = model->forward(in);
    optimizer.zero_grad();
    out.loss.backward();
    optimizer.step();
  };
  step(100);  // gradients and moments exist from here on
  malloc_trim(0);
  const double resident = testing::process_status_mb("VmRSS");
  std::ofstream("/proc/self/clear_refs") << "5";  // the high-water mark starts again here
  if (testing::process_status_mb("VmHWM") > resident + 16) GTEST_SKIP() << "this kernel does not reset the RSS high-water mark";
  step(101);
  const double peak = testing::process_status_mb("VmHWM");
  std::printf("FOOTPRINT mode=%s parameters=%lld resident_mb=%.1f activation_mb=%.1f\n", mode.c_str(),
              static_cast<long long>(parameters), resident, peak - resident);
}

struct Footprint {
  double resident = 0, activation = 0;
  int64_t parameters = 0;
};

Footprint measure(const std::string& mode, const std::string& dir) {
  testing::SubprocessOptions options(std::chrono::seconds(600),
                                     {{"HP_MEMORY_FOOTPRINT_MODE", mode}, {"HP_MEMORY_FOOTPRINT_DIR", dir}, {"OMP_NUM_THREADS", "1"}});
  const auto run = testing::run_subprocess({testing::self_exe(), "--gtest_filter=MemoryFootprintChild.OneStep"}, options);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  if (run.output.find("does not reset the RSS high-water mark") != std::string::npos) return {-1, -1, 0};
  std::smatch m;
  const std::regex line(R"(FOOTPRINT mode=\S+ parameters=(\d+) resident_mb=([\d.]+) activation_mb=(-?[\d.]+))");
  if (!std::regex_search(run.output, m, line)) {
    ADD_FAILURE() << mode << ": no FOOTPRINT line in\n" << run.output;
    return {};
  }
  return {std::stod(m[2]), std::stod(m[3]), std::stoll(m[1])};
}

TEST(MemoryFootprint, EachFeatureCutsWhatItPromises) {
  if (testing::sanitizer_build()) GTEST_SKIP() << "AddressSanitizer holds freed memory back: RSS does not follow the tensors";
  const std::string dir = testing::trainer_runs::temp_dir("memory_footprint");
  std::filesystem::create_directories(dir);
  std::map<std::string, Footprint> f;
  const std::vector<std::string> modes{"plain", "full", "selective", "selective_core", "chunked", "full_chunked", "offload"};
  // Two processes at a time: each one's high-water mark is its own.
  for (size_t i = 0; i < modes.size(); i += 2) {
    auto second = i + 1 < modes.size() ? std::async(std::launch::async, measure, modes[i + 1], dir) : std::future<Footprint>();
    f[modes[i]] = measure(modes[i], dir);
    if (second.valid()) f[modes[i + 1]] = second.get();
  }
  for (const auto& mode : modes) {
    std::printf("%-15s resident %7.1f MB  activation %7.1f MB\n", mode.c_str(), f[mode].resident, f[mode].activation);
  }
  if (f["plain"].resident < 0) GTEST_SKIP() << "this kernel does not reset the RSS high-water mark";
  const double plain = f["plain"].activation;
  ASSERT_GT(plain, 0);
  // Full checkpointing keeps one input per layer (and the loss's terms): at least half goes.
  EXPECT_LE(f["full"].activation, 0.5 * plain);
  // Selective keeps more than full and less than plain, under either policy.
  EXPECT_LT(f["selective"].activation, plain);
  EXPECT_GT(f["selective"].activation, f["full"].activation);
  EXPECT_LT(f["selective_core"].activation, plain);
  // The chunked loss removes the logits term: the [tokens x vocab] fp32 logits and their
  // gradient never exist whole. The plain step's fused cross-entropy (models/cross_entropy.h)
  // keeps only the logits themselves (which the forward also returns) and writes their
  // gradient once, so one logits buffer is what can go (the recompute form saved 0.88 of it on
  // LibTorch 2.11). With this plain (tied) head the chunks are the fused form
  // (models/linear_cross_entropy.h), which holds from the loss's forward what the recompute
  // form makes only in backward: the head weight's [vocab x hidden] fp32 gradient, one chunk's
  // logits and the [tokens x hidden] gradient (42 MB here against 64 MB of logits; measured
  // savings 22 MB plain, 53 MB with full checkpointing). On Qwen3's vocabulary at 2 x 512
  // tokens the fused form peaks lower than the recompute one (RealDataMemory, docs/memory.md).
  const double logits_mb = static_cast<double>(kRows * kSeq * kVocab * 4) / (1024.0 * 1024.0);
  const double held_mb = static_cast<double>((kVocab * 512 + kChunk * kVocab + kRows * kSeq * 512) * 4) / (1024.0 * 1024.0);
  EXPECT_GE(plain - f["chunked"].activation, 0.85 * logits_mb - held_mb);
  EXPECT_GT(plain - f["chunked"].activation, 0.0);
  EXPECT_GE(f["full"].activation - f["full_chunked"].activation, 0.85 * logits_mb - held_mb);
  // Optimizer offload takes AdamW's two fp32 moments out of the resident set (90 % of them at least).
  const double moments_mb = 2.0 * 4.0 * static_cast<double>(f["plain"].parameters) / (1024.0 * 1024.0);
  EXPECT_GE(f["plain"].resident - f["offload"].resident, 0.9 * moments_mb);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hyperparallel
