// FSDP's trace and the order it issues collectives in: every unit's compute and collective
// spans are recorded, and the all-gathers run ahead of the compute that needs them (the
// root's forward issues the first block's, each block's the next one's; in backward the
// root's issues the last block's, each block's the one before it).
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>

#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/platform/trace.h"
#include "support/multiprocess.h"
#include "support/toy_lm.h"

namespace hyperparallel {
namespace {

constexpr int64_t kVocab = 37, kDim = 24, kHidden = 40, kLayers = 3, kSeq = 8, kBatch = 6;

struct Span {
  std::string name, category;
  int64_t start_us;
};

// The spans of a trace, in start order.
std::vector<Span> spans_of(const platform::TraceRecorder& trace) {
  const std::string json = trace.json_events(0);
  const std::regex event("\\{\"name\":\"([^\"]*)\",\"cat\":\"([a-z]+)\",\"ph\":\"X\",\"ts\":(-?[0-9]+)");
  std::vector<Span> spans;
  for (auto it = std::sregex_iterator(json.begin(), json.end(), event); it != std::sregex_iterator(); ++it) {
    spans.push_back({(*it)[1].str(), (*it)[2].str(), std::stoll((*it)[3].str())});
  }
  std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.start_us < b.start_us; });
  return spans;
}

int64_t start_of(const std::vector<Span>& spans, const std::string& name) {
  for (const Span& s : spans) {
    if (s.name == name) return s.start_us;
  }
  ADD_FAILURE() << "no span " << name;
  return 0;
}

// One step of the ToyLM under FSDP (a unit per block plus the root) on this rank's batch.
struct ShardedToyLM {
  explicit ShardedToyLM(testing::RankContext& ctx) {
    at::manual_seed(1234);
    model = std::make_shared<testing::ToyLM>(kVocab, kDim, kHidden, kLayers);
    fsdp::FullyShardOptions options;
    options.mesh = mesh::init_device_mesh(ctx.world, "cpu", {ctx.world->size()}, {"dp_shard"});
    for (auto& b : model->blocks) fsdp::fully_shard(*b, options);
    root = fsdp::fully_shard(*model, options);
  }
  void step(int rank) {
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(77 + rank));
    at::Tensor seq = at::randint(0, kVocab, {kBatch, kSeq + 1}, gen, at::TensorOptions().dtype(at::kLong));
    at::Tensor logits = model->forward(seq.narrow(1, 0, kSeq));
    at::cross_entropy_loss(logits.reshape({-1, kVocab}), seq.narrow(1, 1, kSeq).reshape({-1})).backward();
  }
  std::shared_ptr<testing::ToyLM> model;
  std::optional<fsdp::FSDPModule> root;
};

// The spans of a second step (the first records the forward order that prefetch follows).
std::vector<Span> second_step_spans(testing::RankContext& ctx) {
  ShardedToyLM lm(ctx);
  lm.step(ctx.rank);
  auto trace = std::make_shared<platform::TraceRecorder>();
  lm.root->set_trace(trace);
  lm.step(ctx.rank);
  return spans_of(*trace);
}

// When each all-gather was issued, in order.
std::vector<int64_t> gather_issue_times(const std::vector<Span>& spans) {
  std::vector<int64_t> times;
  for (const Span& s : spans) {
    if (s.category == "comm" && s.name == "all_gather on group 'world'") times.push_back(s.start_us);
  }
  return times;
}

TEST(FsdpShards, TraceRecordsComputeAndCollectivesOfEveryUnit) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    ShardedToyLM lm(ctx);
    auto trace = std::make_shared<platform::TraceRecorder>();
    lm.root->set_trace(trace);
    lm.step(ctx.rank);
    const std::string json = trace->json_events(ctx.rank);
    for (const char* name : {"forward root", "forward layers0", "forward layers2", "backward layers1", "backward root",
                             // A 1-D mesh over every rank shares the world's cached group.
                             "all_gather on group 'world'", "reduce_scatter on group 'world'",
                             "wait all_gather on group 'world'"}) {
      EXPECT_NE(json.find(std::string("\"name\":\"") + name + "\""), std::string::npos) << name;
    }
    EXPECT_NE(json.find("\"pid\":" + std::to_string(ctx.rank)), std::string::npos);
    // 4 units: forward + backward each; 2 all-gathers per block + 1 for the root, 4
    // reduce-scatters: each with a comm span and a wait span.
    EXPECT_EQ(trace->size(), 8u + 2u * (7u + 4u));
  });
}

// Once the first step has recorded the order, every block's forward all-gather is issued
// before that block starts: the first block's by the root's forward (so it overlaps the
// embedding), each later one's by the block before it.
TEST(FsdpShards, EveryBlocksForwardGatherIsIssuedBeforeTheBlockRuns) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    const std::vector<Span> spans = second_step_spans(ctx);
    const std::vector<int64_t> gathers = gather_issue_times(spans);  // forward's first: the root's, then block by block
    ASSERT_EQ(gathers.size(), 1u + 2u * kLayers);
    for (int64_t b = 0; b < kLayers; ++b) {
      EXPECT_LT(gathers[1 + b], start_of(spans, "forward layers" + std::to_string(b))) << "block " << b;
    }
  });
}

// In backward too: the root's pre-backward issues the last block's all-gather (it overlaps the
// head's backward), each block's pre-backward the one before it, so no block's backward
// starts by issuing its own.
TEST(FsdpShards, EveryBlocksBackwardGatherIsIssuedBeforeTheBlocksBackward) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    const std::vector<Span> spans = second_step_spans(ctx);
    const std::vector<int64_t> gathers = gather_issue_times(spans);  // forward's, then backward's, last block first
    ASSERT_EQ(gathers.size(), 1u + 2u * kLayers);
    for (int64_t i = 0; i < kLayers; ++i) {
      const int64_t b = kLayers - 1 - i;
      EXPECT_LT(gathers[1 + kLayers + i], start_of(spans, "backward layers" + std::to_string(b))) << "block " << b;
    }
  });
}

}  // namespace
}  // namespace hyperparallel
