// The trainer test suites' runs. See trainer_runs.h.
#include "support/trainer_runs.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/train/trainer.h"
#include "support/multiprocess.h"
#include "support/plain_reference.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;

namespace hyperparallel::testing::trainer_runs {

// The same path in the test and in the rank processes it starts (so no pid in it).
std::string temp_dir(const std::string& name) { return ::testing::TempDir() + "hp_trainer_" + name; }

// The debug model on the synthetic data with a global batch of 8 rows, 20 steps, logging
// every step; `layout` adds the per-rank batch, accumulation and fsdp keys.
std::vector<std::string> base_overrides(const std::string& output_dir) {
  return {"model_name_or_path=qwen3-debug",
          "tokenizer=" HP_SOURCE_DIR "/examples/tokenizer",
          "dataset=synthetic_reverse",
          "template=qwen3",
          "max_samples=400",
          "cutoff_len=64",
          "learning_rate=2.0e-3",
          "lr_scheduler_type=cosine",
          "warmup_steps=3",
          "weight_decay=0.01",
          "max_grad_norm=1.0",
          "max_steps=20",
          "logging_steps=1",
          "seed=7",
          "output_dir=" + output_dir};
}

std::vector<double> logged(const std::string& output_dir, const char* key) {
  std::ifstream in(output_dir + "/trainer_log.jsonl");
  std::vector<double> values;
  for (std::string line; std::getline(in, line);) values.push_back(nlohmann::json::parse(line).at(key).get<double>());
  return values;
}

std::vector<double> logged_losses(const std::string& output_dir) { return logged(output_dir, "loss"); }

void train_on(int ranks, const std::string& output_dir, const std::vector<std::string>& layout, int64_t steps) {
  std::vector<std::string> overrides = base_overrides(output_dir);
  overrides.insert(overrides.end(), layout.begin(), layout.end());
  if (!hp::testing::is_rank_process()) fs::remove_all(output_dir);  // a rank process must not touch earlier runs
  hp::testing::run_on_ranks(ranks, [&](hp::testing::RankContext& ctx) {
    std::ostringstream log;
    const auto result = hp::train::run_training(hp::train::load_train_config("", overrides), ctx.world, log);
    EXPECT_EQ(result.steps, steps);
  });
}


// Each layout's logged per-step losses and gradient norms against the plain unsharded model
// (support/plain_reference.h) at the same global batch of 8 rows; `layouts` run first, since a
// rank process runs only its own run_on_ranks call and exits there.
void expect_layouts_match_the_plain_model(const Layouts& layouts, bool learns) {
  for (const auto& [name, ranks, layout] : layouts) train_on(ranks, temp_dir(name), layout);
  std::vector<std::string> overrides = base_overrides(temp_dir("plain"));
  overrides.push_back("per_device_train_batch_size=8");
  const hp::testing::PlainRun ref = hp::testing::plain_reference_run(hp::train::load_train_config("", overrides));
  ASSERT_EQ(ref.losses.size(), 20u);
  if (learns) {
    EXPECT_LT(ref.losses.back(), ref.losses.front() * 0.7) << "the run should learn";
  }
  for (const auto& [name, ranks, layout] : layouts) {
    SCOPED_TRACE(name);
    const auto got = logged_losses(temp_dir(name)), norms = logged(temp_dir(name), "grad_norm");
    ASSERT_EQ(got.size(), ref.losses.size());
    double worst = 0;
    for (size_t s = 0; s < got.size(); ++s) {
      EXPECT_NEAR(got[s], ref.losses[s], 1e-5 * std::abs(ref.losses[s])) << "step " << s + 1;
      EXPECT_NEAR(norms[s], ref.grad_norms[s], 1e-5 * std::abs(ref.grad_norms[s])) << "grad_norm, step " << s + 1;
      worst = std::max(worst, std::abs(got[s] - ref.losses[s]) / std::abs(ref.losses[s]));
    }
    std::cout << name << ": largest relative loss difference to the plain model over 20 steps " << worst << "\n";
  }
}

// Trains `layouts` with `common` added, then the plain model with `common` at the global
// batch of 8 rows, and compares every step's loss, gradient norm and (MoE) aux loss, 1e-5
// relative.
void expect_runs_match_the_plain_model(const std::vector<std::string>& common,
                                       const std::vector<std::tuple<std::string, int, std::vector<std::string>>>& layouts, int64_t steps,
                                       bool keep_outputs) {
  for (const auto& [name, ranks, layout] : layouts) {
    std::vector<std::string> extra = common;
    extra.insert(extra.end(), layout.begin(), layout.end());
    train_on(ranks, temp_dir(name), extra, steps);
  }
  std::vector<std::string> overrides = base_overrides(temp_dir("plain_" + std::get<0>(layouts.front())));
  overrides.insert(overrides.end(), common.begin(), common.end());
  overrides.push_back("per_device_train_batch_size=8");
  const hp::testing::PlainRun ref = hp::testing::plain_reference_run(hp::train::load_train_config("", overrides));
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(steps));
  for (const auto& [name, ranks, layout] : layouts) {
    SCOPED_TRACE(name);
    const auto losses = logged_losses(temp_dir(name)), norms = logged(temp_dir(name), "grad_norm");
    ASSERT_EQ(losses.size(), ref.losses.size());
    const auto aux = ref.aux_losses.empty() ? std::vector<double>() : logged(temp_dir(name), "aux_loss");
    double worst = 0;
    for (size_t s = 0; s < losses.size(); ++s) {
      EXPECT_NEAR(losses[s], ref.losses[s], 1e-5 * ref.losses[s]) << "step " << s + 1;
      EXPECT_NEAR(norms[s], ref.grad_norms[s], 1e-5 * ref.grad_norms[s]) << "grad_norm, step " << s + 1;
      if (!aux.empty()) {
        EXPECT_NEAR(aux[s], ref.aux_losses[s], 1e-5 * ref.aux_losses[s]) << "aux, step " << s + 1;
      }
      worst = std::max(worst, std::abs(losses[s] - ref.losses[s]) / ref.losses[s]);
    }
    std::cout << name << ": largest relative loss difference to the plain model over " << steps << " steps " << worst << "\n";
  }
  if (keep_outputs) return;
  for (const auto& [name, ranks, layout] : layouts) fs::remove_all(temp_dir(name));
}

// Each (ranks, overrides, message) fails in run_training with a UserError containing message.
void expect_user_errors_before_training(const std::vector<std::tuple<int, std::vector<std::string>, std::string>>& misfits,
                                        const std::string& dir_name) {
  for (const auto& [ranks, extra, expected] : misfits) {
    std::vector<std::string> o = base_overrides(temp_dir(dir_name));
    o.insert(o.end(), extra.begin(), extra.end());
    hp::testing::run_on_ranks(ranks, [&](hp::testing::RankContext& ctx) {
      std::ostringstream log;
      try {
        hp::train::run_training(hp::train::load_train_config("", o), ctx.world, log);
        ADD_FAILURE() << "trained with " << extra.back();
      } catch (const hp::UserError& e) {
        EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      }
    });
  }
  fs::remove_all(temp_dir(dir_name));
}

}  // namespace hyperparallel::testing::trainer_runs
