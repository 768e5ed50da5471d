// HyperParallel's trainer YAML as a config dialect: the flagship example translates to the
// keys it means, command-line overrides in HyperParallel's spelling, every _target_ of the
// table accepted and any other refused naming the built-ins, and mistyped files (a bad
// _target_, tp not dividing the kv heads, ep not dividing the experts) end with exit code 2 and
// the fix.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/train/train_config.h"
#include "support/subprocess.h"

namespace hp = hyperparallel;

namespace {

const std::string kExample = HP_SOURCE_DIR "/examples/hp_qwen3_moe_4d.yaml";

std::string example_text() {
  std::ifstream in(kExample);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string write_yaml(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "hp_hpyaml_" + name + ".yaml";
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

std::string user_error_of(const std::string& path, const std::vector<std::string>& overrides = {}) {
  try {
    hp::train::load_train_config(path, overrides);
  } catch (const hp::UserError& e) {
    return e.what();
  }
  return "(no error)";
}

bool ignored(const hp::train::TrainConfig& c, const std::string& key) {
  return std::any_of(c.ignored_keys.begin(), c.ignored_keys.end(), [&](const auto& k) { return k.first == key; });
}

}  // namespace

TEST(HyperParallelYaml, TheFlagshipExampleMeansTheLayoutItNames) {
  const hp::train::TrainConfig c = hp::train::load_train_config(kExample, {});
  EXPECT_EQ(c.model_name_or_path, "qwen3-moe-4d-debug");
  EXPECT_EQ(c.max_steps, 20);
  EXPECT_EQ(c.global_batch_size, 8);
  EXPECT_EQ(c.per_device_train_batch_size, 4);
  EXPECT_EQ(c.seed, 42);
  EXPECT_EQ(c.accelerator.tp_size, 2);
  EXPECT_EQ(c.accelerator.cp_size, 2);
  EXPECT_EQ(c.accelerator.ep_size, 2);
  EXPECT_TRUE(c.accelerator.sequence_parallel && c.accelerator.loss_parallel);
  EXPECT_EQ(c.accelerator.cp_algorithm, "ulysses");  // the when: cp wrapper
  EXPECT_EQ(c.fsdp_config.dp_shard_size, 2);
  EXPECT_EQ(c.fsdp_config.edp_shard_size, 4);
  EXPECT_TRUE(c.plan_overrides.empty());  // the RMSNorm fusion has no TP plan: the plain norm runs
  EXPECT_FALSE(c.bf16);
  EXPECT_FALSE(c.validate_placement);
  EXPECT_DOUBLE_EQ(c.learning_rate, 3.0e-3);
  EXPECT_DOUBLE_EQ(c.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(c.adam_beta2, 0.95);
  EXPECT_EQ(c.lr_scheduler_type, "cosine_with_min_lr");
  EXPECT_DOUBLE_EQ(c.lr_scheduler_kwargs.min_lr.value_or(0), 1.0e-4);
  EXPECT_EQ(c.warmup_steps, 2);
  EXPECT_EQ(c.output_dir, "output/hp_qwen3_moe_4d");
  EXPECT_EQ(c.dataset, "synthetic_reverse");
  EXPECT_EQ(c.cutoff_len, 64);
  EXPECT_EQ(c.tokenizer, "examples/tokenizer");
  EXPECT_EQ(c.chat_template, "qwen3");
  for (const char* key : {"training.backend", "training.init_device", "model.attn_implementation", "plan_overrides[0]",
                          "plan_overrides[2]", "optimizer.no_decay_params"}) {
    EXPECT_TRUE(ignored(c, key)) << key;
  }
}

TEST(HyperParallelYaml, OverridesUseHyperParallelsSpelling) {
  const hp::train::TrainConfig c = hp::train::load_train_config(
      kExample, {"model.validate_placement=true", "training.train_iters=5", "accelerator.cp_size=1",
                 "optimizer.adamw_config.adamw_lr=1.0e-3", "max_grad_norm=0.5"});
  EXPECT_TRUE(c.validate_placement);
  EXPECT_EQ(c.max_steps, 5);
  EXPECT_EQ(c.accelerator.cp_size, 1);
  EXPECT_DOUBLE_EQ(c.learning_rate, 1.0e-3);
  EXPECT_DOUBLE_EQ(c.max_grad_norm, 0.5);  // a key of ours passes through
  EXPECT_NE(user_error_of(kExample, {"training.train_iterz=5"}).find("training.train_iterz is not a key this build reads"),
            std::string::npos);
}

TEST(HyperParallelYaml, UnknownTargetsAndKeysAreNamedWithTheBuiltins) {
  const std::string text = example_text();
  const auto error_of = [&](const std::string& from, const std::string& to) {
    return user_error_of(write_yaml("variant", replaced(text, from, to)));
  };
  EXPECT_NE(error_of("components.optim.optimizer.AdamW", "components.optim.optimizer.Lion")
                .find("optimizer._target_: 'hyper_parallel.auto_models.components.optim.optimizer.Lion' is not one of HyperParallel's "
                      "builders this build maps (built-ins for optimizer: *AdamW, *Muon)"),
            std::string::npos);
  EXPECT_NE(error_of("_transformers.HyperAutoModelForCausalLM.from_pretrained", "my_models.Custom")
                .find("built-ins for model: *AutoModelForCausalLM.from_pretrained"),
            std::string::npos);
  EXPECT_NE(error_of("loss_aggregation: token_weighted", "loss_aggregation: sample_weighted").find("only token_weighted"),
            std::string::npos);
  EXPECT_NE(error_of("debug:\n", "extras:\n  a: 1\ndebug:\n").find("extras is not a section of HyperParallel's trainer YAML"),
            std::string::npos);
  EXPECT_NE(error_of("  train_iters: 20\n", "  train_iters: 20\n  train_iterations: 5\n").find("did you mean"), std::string::npos);
}

// Through the command line: one line, exit code 2, before or as the ranks start.
TEST(HyperParallelYaml, MistypedFilesEndWithExitCodeTwoAndTheFix) {
  const std::string text = example_text();
  const std::string out = "--checkpoint.checkpoint_dir=" + ::testing::TempDir() + "hp_hpyaml_out";
  const std::string tokenizer = "--dataset.model_assets.tokenizer.pretrained_model_name_or_path=" HP_SOURCE_DIR "/examples/tokenizer";
  const struct {
    std::string from, to, ranks, expected;
    std::vector<std::string> extra;
  } cases[] = {
      {"qwen3moe_ep_compute_fn", "my_ep_fn", "8",
       "local_compute_fn._target_: 'hyper_parallel.auto_models.components.distributed.ep_compute.my_ep_fn' is not one of", {}},
      {"  tp_size: 2\n  cp_size: 2\n  ep_size: 2\n", "  tp_size: 3\n  cp_size: 1\n  ep_size: 1\n", "3",
       "tp_size 3 does not fit qwen3_moe: num_attention_heads (8) must divide by it and num_key_value_heads (4) must divide by it or "
       "divide it; valid tp sizes: 1, 2, 4, 8",
       {"--training.global_batch_size=12"}},
      {"  tp_size: 2\n  cp_size: 2\n  ep_size: 2\n  pp_size: 1\n  sequence_parallel: true\n  loss_parallel: true\n",
       "  tp_size: 1\n  cp_size: 1\n  ep_size: 3\n", "3",
       "accelerator.ep_size 3 does not divide the model's num_experts (8); valid ep sizes: 1, 2, 4, 8", {"--training.global_batch_size=12"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.to);
    std::string yaml = replaced(text, c.from, c.to);
    yaml = replaced(yaml, "  dp_shard_size: 2 ", "  dp_shard_size: -1 ");
    yaml = replaced(yaml, "  edp_shard_size: 4 ", "  edp_shard_size: -1 ");
    std::vector<std::string> argv = {HP_CLI_PATH, "train", write_yaml("cli", yaml), "--nproc_per_node=" + c.ranks, out, tokenizer};
    argv.insert(argv.end(), c.extra.begin(), c.extra.end());
    const auto run = hp::testing::run_subprocess(argv);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find(c.expected), std::string::npos) << run.output;
  }
}
