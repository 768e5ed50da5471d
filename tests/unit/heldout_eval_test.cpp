// Held-out evaluation: sharded over ranks it gives the 1-process answers (every rank runs the
// same forwards, including a rank without prompts), and a config without a synthetic dataset
// is refused.
#include <gtest/gtest.h>

#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/platform/user_error.h"
#include "support/multiprocess.h"
#include "train/heldout_eval.h"

namespace hp = hyperparallel;

namespace {

hp::train::TrainConfig eval_config(int64_t samples) {
  return hp::train::load_train_config("", {"model_name_or_path=qwen3-debug", "tokenizer=" HP_SOURCE_DIR "/examples/tokenizer",
                                           "dataset=synthetic_addition,synthetic_reverse", "template=qwen3",
                                           "output_dir=" + ::testing::TempDir() + "hp_heldout",
                                           "heldout_eval_samples=" + std::to_string(samples)});
}

hp::train::HeldoutScore evaluate(int64_t samples, const std::shared_ptr<hp::comm::Communicator>& world, bool sharded) {
  const auto config = eval_config(samples);
  const auto tokenizer = hp::data::Tokenizer::from_file(config.tokenizer);
  hp::models::ModelLoadOptions load;
  load.seed = 5;
  auto model = hp::models::AutoModelForCausalLM::from_pretrained("qwen3-debug", load);
  if (sharded) {
    hp::fsdp::FullyShardOptions options;
    options.mesh = hp::mesh::init_device_mesh(world, "cpu", {world->size()}, {"dp_shard"});
    for (auto* layer : model->decoder_layers()) hp::fsdp::fully_shard(*layer, options);
    hp::fsdp::fully_shard(*model, options);
  }
  return hp::train::evaluate_heldout(*model, tokenizer, config, *world, world->rank(), world->size());
}

}  // namespace

TEST(HeldoutEval, ShardedOverRanksItGivesTheOneProcessAnswers) {
  // 7 prompts over 3 ranks (3, 3, 1) and 1 prompt over 2 ranks (rank 1 has none).
  for (const auto& [samples, ranks] : std::vector<std::pair<int64_t, int>>{{7, 3}, {1, 2}}) {
    const auto reference = evaluate(samples, hp::comm::init_process_group(hp::comm::RendezvousInfo{}), false);
    ASSERT_EQ(reference.total, samples);
    ASSERT_EQ(static_cast<int64_t>(reference.answers.size()), samples);
    // Both datasets contribute (addition first), and a random model answers something.
    EXPECT_NE(reference.answers.front().prompt.find("What is"), std::string::npos);
    if (samples > 1) {
      EXPECT_NE(reference.answers.back().prompt.find("Reverse"), std::string::npos);
    }
    hp::testing::run_on_ranks(ranks, [&](hp::testing::RankContext& ctx) {
      const auto score = evaluate(samples, ctx.world, true);
      EXPECT_EQ(score.total, samples);
      EXPECT_EQ(score.correct, reference.correct);
      const int64_t chunk = (samples + ranks - 1) / ranks;
      const int64_t begin = std::min<int64_t>(samples, ctx.rank * chunk);
      for (size_t i = 0; i < score.answers.size(); ++i) {
        EXPECT_EQ(score.answers[i].prompt, reference.answers[begin + i].prompt);
        EXPECT_EQ(score.answers[i].answer, reference.answers[begin + i].answer) << "rank " << ctx.rank << " prompt " << begin + i;
      }
      EXPECT_EQ(static_cast<int64_t>(score.answers.size()), std::min<int64_t>(samples, begin + chunk) - begin);
    });
  }
}

TEST(HeldoutEval, NeedsABuiltInSyntheticDataset) {
  auto config = eval_config(4);
  config.dataset = "alpaca_en,my_data";
  try {
    hp::train::check_heldout_config(config);
    FAIL() << "no error";
  } catch (const hp::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("heldout_eval_samples: needs a built-in synthetic dataset"), std::string::npos) << e.what();
  }
  config.heldout_eval_samples = 0;
  EXPECT_NO_THROW(hp::train::check_heldout_config(config));
}
