// One training configuration of a ~25 M-parameter transformer-shaped model (ToyLM from
// tests/support/toy_lm.h: embedding, 6 blocks of norm + 640->2560->640 MLP, a final norm,
// head tied to the embedding), for the FSDP table in
// docs/benchmarks.md. scripts/bench_fsdp.sh runs every mode in one go:
//   single        one process, no communication
//   local         every rank trains the whole model on its own rows and never communicates:
//                 the step an FSDP rank would take if communication were free (same threads)
//   ddp           every rank holds the whole model; gradients all-reduced (avg) in 25 MB
//                 buckets overlapped with backward, as c10d's Reducer does (bucketed_ddp.h)
//   fsdp_unfused  fully_shard per block + root, one collective per parameter
//   fsdp          fully_shard, fused collectives, prefetch 1, reduce-scatter overlapped
//   fsdp_keep     the same with reshard_after_forward=false: the blocks stay gathered from
//                 forward to backward (one all-gather each; DDP's bytes, sharded optimizer)
// `fsdp_bench MODE STEPS --trace FILE` also writes a Chrome trace of the last two steps
// (compute spans per unit, each collective from issue to completion, time blocked in wait).
// Prints one line: RESULT mode=... step_ms=... exposed=... rss_mb=... bytes_mb=... exact_mb=...
// textbook_mb=... blas=... (exposed: time blocked in wait() / step time; bytes: sent per rank per step).
// Every mode runs with the caching host allocator the trainer installs.
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "bench_common.h"
#include "bucketed_ddp.h"
#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/fsdp/module_hooks.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/platform/blas_check.h"
#include "hyperparallel/platform/trace.h"
#include "support/toy_lm.h"

namespace hp = hyperparallel;

namespace {

constexpr int64_t kVocab = 8192, kDim = 640, kHidden = 2560, kLayers = 6, kSeq = 64, kBatch = 4;

}  // namespace


int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "fsdp";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 6;
  const std::string trace_path = argc > 4 && std::string(argv[3]) == "--trace" ? argv[4] : "";
  const std::vector<std::string> modes{"single", "local", "ddp", "fsdp_unfused", "fsdp", "fsdp_keep"};
  if (std::find(modes.begin(), modes.end(), mode) == modes.end()) {
    std::fprintf(stderr, "fsdp_bench: unknown mode '%s' (single, local, ddp, fsdp_unfused, fsdp, fsdp_keep)\n", mode.c_str());
    return 2;
  }
  hp::benchmarks::install_host_cache();
  auto world = hp::comm::init_process_group(hp::comm::rendezvous_info_from_env());
  const int n = world->size();
  at::manual_seed(0);
  auto model = std::make_shared<hp::testing::ToyLM>(kVocab, kDim, kHidden, kLayers);
  int64_t numel = 0;
  for (const auto& p : model->parameters()) numel += p.numel();

  auto mesh = hp::mesh::init_device_mesh(world, "cpu", {n}, {"dp_shard"});
  auto comm = mesh.comm("dp_shard");
  // Our design's exact traffic: blocks all-gather twice (forward, backward) and reduce-
  // scatter once; the root keeps its parameters through backward, so it gathers once.
  double exact_bytes = 0;
  std::optional<hp::fsdp::FSDPModule> root;
  if (mode == "fsdp" || mode == "fsdp_unfused" || mode == "fsdp_keep") {
    hp::fsdp::FullyShardOptions options;
    options.mesh = mesh;
    options.comm_fusion = mode != "fsdp_unfused";
    // fsdp_keep keeps the gathered blocks from forward to backward: one all-gather per block.
    options.reshard_after_forward = mode != "fsdp_keep";
    const double block_collectives = mode == "fsdp_keep" ? 2.0 : 3.0;
    for (auto& b : model->blocks) exact_bytes += block_collectives * (n - 1) * hp::fsdp::fully_shard(*b, options).sharded_numel() * 4;
    root = hp::fsdp::fully_shard(*model, options);
    exact_bytes += 2.0 * (n - 1) * root->sharded_numel() * 4;
  }
  auto trace = std::make_shared<hp::platform::TraceRecorder>();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4));
  std::optional<hp::benchmarks::BucketedDdp> ddp;
  if (mode == "ddp" && n > 1) {
    ddp.emplace(model->parameters(), comm);
    for (int64_t b : ddp->bucket_numels()) exact_bytes += 2.0 * (n - 1) * ((b + n - 1) / n) * 4;
  }

  std::vector<double> times;
  double exposed = 0;
  hp::comm::CommCounters bytes_before;
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(100 + world->rank()));
  for (int s = 0; s < steps + 2; ++s) {
    if (s == 2) bytes_before = comm->counters();
    if (s == steps && !trace_path.empty()) {  // trace the last two steps
      if (root) root->set_trace(trace);
      comm->set_trace(trace);
    }
    at::Tensor seq = at::randint(0, kVocab, {kBatch, kSeq + 1}, gen, at::TensorOptions().dtype(at::kLong));
    world->barrier().wait();
    const double wait_before = comm->wait_seconds();  // after the barrier: it is not part of the step
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor logits = model->forward(seq.narrow(1, 0, kSeq));
    at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, kVocab}), seq.narrow(1, 1, kSeq).reshape({-1}));
    opt.zero_grad();
    loss.backward();
    if (ddp) ddp->finish();
    const auto step_started = std::chrono::steady_clock::now();
    opt.step();
    if (!trace_path.empty()) trace->span("optimizer step", "compute", step_started, std::chrono::steady_clock::now());
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= 2) {
      times.push_back(dt);
      exposed += comm->wait_seconds() - wait_before;
    }
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  double total = 0;
  for (double t : times) total += t;
  const auto traffic = comm->counters() - bytes_before;
  // FSDP's textbook traffic: all-gather in forward and backward (forward only for fsdp_keep)
  // plus a reduce-scatter, each moving (n-1)/n of the fp32 parameters per rank; DDP's: one
  // all-reduce, 2 (n-1)/n.
  const double param_bytes = static_cast<double>(numel) * 4;
  const double textbook = mode == "single" || mode == "local"        ? 0.0
                          : mode == "ddp" || mode == "fsdp_keep" ? 2.0 * (n - 1) / n * param_bytes
                                                                 : 3.0 * (n - 1) / n * param_bytes;
  at::Tensor rss = at::tensor({hp::benchmarks::peak_rss_mb()}, at::kDouble);
  world->all_reduce(rss, hp::comm::ReduceOp::kMax).wait();
  if (world->rank() == 0) {
    std::printf("RESULT mode=%s ranks=%d params=%.1fM step_ms=%.1f exposed=%.3f rss_mb=%.0f bytes_mb=%.2f "
                "exact_mb=%.2f textbook_mb=%.2f blas=%s\n",
                mode.c_str(), n, numel / 1e6, median * 1e3, exposed / total, rss.item<double>(),
                static_cast<double>(traffic.total_bytes()) / steps / 1e6, exact_bytes / 1e6, n > 1 ? textbook / 1e6 : 0.0,
                hp::platform::loaded_blas().kernels.c_str());
  }
  if (!trace_path.empty()) hp::benchmarks::write_trace(*world, *trace, trace_path);
  world->barrier().wait();
  return 0;
}
