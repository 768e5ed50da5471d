// The trainer test suites' runs: the debug model on the synthetic data at a global batch of
// 8 rows, each layout trained on real ranks through run_training and compared with the plain
// unsharded model (support/plain_reference.h) step by step. A rank process runs the test body
// up to its own run_on_ranks call and exits there, so a test trains its layouts first and
// reads logs and references after.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace hyperparallel::testing::trainer_runs {

using Layouts = std::vector<std::tuple<std::string, int, std::vector<std::string>>>;  // name, ranks, overrides

// The same path in the test and in the rank processes it starts (so no pid in it).
std::string temp_dir(const std::string& name);
// The debug model on the synthetic data, global batch 8, 20 steps logged every step.
std::vector<std::string> base_overrides(const std::string& output_dir);
std::vector<double> logged(const std::string& output_dir, const char* key);
std::vector<double> logged_losses(const std::string& output_dir);
// base_overrides + `layout` on `ranks` ranks (a fresh output_dir); expects `steps` steps.
void train_on(int ranks, const std::string& output_dir, const std::vector<std::string>& layout, int64_t steps = 20);
// Each layout's 20 logged losses and gradient norms against the plain model (1e-5).
void expect_layouts_match_the_plain_model(const Layouts& layouts, bool learns = false);
// The layouts with `common` added against the plain model with `common`: losses, gradient norms
// and (MoE) aux losses, 1e-5; their output folders removed after unless `keep_outputs`.
void expect_runs_match_the_plain_model(const std::vector<std::string>& common, const Layouts& layouts, int64_t steps,
                                       bool keep_outputs = false);
// Each (ranks, overrides, message) fails in run_training with a UserError containing message.
void expect_user_errors_before_training(const std::vector<std::tuple<int, std::vector<std::string>, std::string>>& misfits,
                                        const std::string& dir_name);

}  // namespace hyperparallel::testing::trainer_runs
