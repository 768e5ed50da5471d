// Same numbers as PyTorch's own FSDP2: from the same initial weights and global batches, 20
// fp32 AdamW steps of `torch.distributed.fsdp.fully_shard` (the torch of the project's Python
// environment, benchmarks/torch_fsdp2_bench.py, launched by our launcher on real Gloo ranks),
// of our fully_shard, and of the plain unsharded model give the same losses (1e-5 relative)
// and parameters. The model is ToyLM (tests/support/toy_lm.h) and its PyTorch twin
// (benchmarks/torch_peer_lm.py); the batches come from ATen's generator on both sides.
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <regex>
#include <sstream>

#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/io/safetensors.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "support/multiprocess.h"
#include "support/subprocess.h"
#include "support/toy_lm.h"
#include "support/trainer_runs.h"

namespace hyperparallel {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 37, kDim = 24, kHidden = 40, kLayers = 3, kSeq = 8, kBatch = 12;
constexpr int kSteps = 20;
constexpr double kLr = 1e-2;

std::shared_ptr<testing::ToyLM> make_model() {
  at::manual_seed(4321);
  return std::make_shared<testing::ToyLM>(kVocab, kDim, kHidden, kLayers);
}

// Rows [first, first + count) of step `step`'s global batch (generator 77 + step, as the
// Python side draws it).
at::Tensor batch_rows(int step, int64_t first, int64_t count) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(77 + step));
  return at::randint(0, kVocab, {kBatch, kSeq + 1}, gen, at::TensorOptions().dtype(at::kLong)).narrow(0, first, count);
}

at::Tensor next_token_loss(testing::ToyLM& model, const at::Tensor& seq) {
  const at::Tensor logits = model.forward(seq.narrow(1, 0, kSeq));
  return at::cross_entropy_loss(logits.reshape({-1, kVocab}), seq.narrow(1, 1, kSeq).reshape({-1}));
}

torch::optim::AdamW make_optimizer(testing::ToyLM& model) {
  return torch::optim::AdamW(model.parameters(), torch::optim::AdamWOptions(kLr).weight_decay(0.01));
}

struct Trajectory {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
};

Trajectory train_plain() {
  auto model = make_model();
  auto opt = make_optimizer(*model);
  Trajectory t;
  for (int s = 0; s < kSteps; ++s) {
    at::Tensor loss = next_token_loss(*model, batch_rows(s, 0, kBatch));
    opt.zero_grad();
    loss.backward();
    opt.step();
    t.losses.push_back(loss.item<double>());
  }
  for (const auto& item : model->named_parameters()) t.params[item.key()] = item.value().detach().clone();
  return t;
}

// Our fully_shard per block and root on the ranks of `ctx`; rank 0 writes the mean loss of
// every step, one per line, to `losses_path`.
void train_ours(testing::RankContext& ctx, const std::string& losses_path) {
  auto model = make_model();
  fsdp::FullyShardOptions options;
  options.mesh = mesh::init_device_mesh(ctx.world, "cpu", {ctx.world_size}, {"dp_shard"});
  for (auto& b : model->blocks) fsdp::fully_shard(*b, options);
  fsdp::fully_shard(*model, options);
  auto opt = make_optimizer(*model);
  const int64_t per_rank = kBatch / ctx.world_size;
  std::ofstream out;
  if (ctx.rank == 0) out.open(losses_path);
  for (int s = 0; s < kSteps; ++s) {
    at::Tensor loss = next_token_loss(*model, batch_rows(s, ctx.rank * per_rank, per_rank));
    opt.zero_grad();
    loss.backward();
    opt.step();
    at::Tensor mean = loss.detach().clone();
    ctx.world->all_reduce(mean, comm::ReduceOp::kAvg).wait();
    if (ctx.rank == 0) out << std::setprecision(17) << mean.item<double>() << "\n";
  }
}

std::vector<double> read_losses(const std::string& path) {
  std::ifstream in(path);
  std::vector<double> losses;
  for (double v; in >> v;) losses.push_back(v);
  return losses;
}

// PyTorch FSDP2 on `ranks` ranks from `weights`; its losses, and its trained parameters in `out`.
std::vector<double> train_torch_fsdp2(int ranks, bool keep, const std::string& weights, const std::string& out) {
  std::vector<std::string> argv = {HP_CLI_PATH, "run", "--nproc-per-node", std::to_string(ranks), "--", HP_PYTHON_PATH,
                                   HP_SOURCE_DIR "/benchmarks/torch_fsdp2_bench.py", "trajectory", "--weights", weights,
                                   "--dims", std::to_string(kVocab) + "," + std::to_string(kDim) + "," + std::to_string(kHidden) + "," + std::to_string(kLayers),
                                   "--seq", std::to_string(kSeq), "--batch", std::to_string(kBatch), "--steps",
                                   std::to_string(kSteps), "--lr", "0.01", "--out", out};
  if (keep) argv.push_back("--keep");
  const auto run = testing::run_subprocess(argv, {std::chrono::seconds(240)});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  std::vector<double> losses;
  const std::regex line(R"(LOSS (\d+) (\S+))");
  std::istringstream lines(run.output);
  for (std::string l; std::getline(lines, l);) {
    std::smatch m;
    if (std::regex_search(l, m, line)) losses.push_back(std::stod(m[2]));
  }
  EXPECT_EQ(losses.size(), static_cast<size_t>(kSteps)) << run.output;
  return losses;
}

void expect_same_losses(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t s = 0; s < want.size(); ++s) EXPECT_NEAR(got[s], want[s], 1e-5 * std::abs(want[s])) << what << ", step " << s;
}

TEST(FsdpTorchPeer, PyTorchFsdp2OursAndThePlainModelTrainToTheSameNumbers) {
  if (std::string(HP_PYTHON_PATH).empty()) GTEST_SKIP() << "built against a LibTorch without the project's Python environment";
  const std::string dir = testing::trainer_runs::temp_dir("fsdp_torch_peer");
  const std::string ours_path = dir + "/ours_losses.txt";
  if (!testing::is_rank_process()) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  testing::run_on_ranks(2, [&](testing::RankContext& ctx) { train_ours(ctx, ours_path); });

  const Trajectory plain = train_plain();
  expect_same_losses(read_losses(ours_path), plain.losses, "our FSDP, 2 ranks");
  std::vector<std::pair<std::string, at::Tensor>> initial;
  for (const auto& item : make_model()->named_parameters()) initial.emplace_back(item.key(), item.value().detach());
  const std::string weights = dir + "/initial.safetensors";
  io::write_safetensors(weights, initial);
  for (const auto& [ranks, keep] : std::vector<std::pair<int, bool>>{{2, false}, {2, true}, {4, false}}) {
    const std::string what = "PyTorch FSDP2, " + std::to_string(ranks) + " ranks, reshard_after_forward=" + (keep ? "False" : "True");
    const std::string trained = dir + "/torch_" + std::to_string(ranks) + (keep ? "_keep" : "") + ".safetensors";
    const std::vector<double> torch_losses = train_torch_fsdp2(ranks, keep, weights, trained);
    expect_same_losses(torch_losses, plain.losses, what);
    expect_same_losses(torch_losses, read_losses(ours_path), what + " vs ours");
    if (!fs::exists(trained)) continue;
    const io::SafetensorsFile file(trained);
    ASSERT_EQ(file.entries().size(), plain.params.size()) << what;
    for (const auto& [name, want] : plain.params) {
      const at::Tensor got = file.read(name);
      EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << what << ": " << name << " max diff "
                                                       << (got - want).abs().max().item<double>();
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hyperparallel
