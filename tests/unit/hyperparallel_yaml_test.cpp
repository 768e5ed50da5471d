// HyperParallel's trainer YAML as a config dialect: the flagship example translates to the
// keys it means, command-line overrides in HyperParallel's spelling, every _target_ of the
// table accepted and any other refused naming the built-ins, and mistyped files (a bad
// _target_, tp not dividing the kv heads, ep not dividing the experts) end with exit code 2 and
// the fix.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/train/train_config.h"
#include "support/subprocess.h"
#include "support/trainer_runs.h"

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

namespace {

// A small HyperParallel file on the debug Qwen3 reading `dataset` (its dataset section's
// entries, indented under it), 3 steps of 4 rows, logged every step, into `out`.
std::string small_job(const std::string& dataset, const std::string& out) {
  return "model:\n"
         "  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained\n"
         "  pretrained_model_name_or_path: qwen3-debug\n"
         "training:\n  train_iters: 3\n  global_batch_size: 4\n  micro_batch_size: 2\n  seed: 7\n  log_interval: 1\n"
         "dataset:\n"
         "  model_assets:\n    tokenizer:\n      pretrained_model_name_or_path: " HP_SOURCE_DIR "/examples/tokenizer\n" +
         dataset + "checkpoint:\n  checkpoint_dir: " + out + "\n";
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::trunc) << text; }

// Trains `yaml` in one process (plus `extra` flags); its logged losses.
std::vector<double> losses_of(const std::string& name, const std::string& yaml, const std::vector<std::string>& extra = {}) {
  std::filesystem::remove_all(::testing::TempDir() + "hp_hpyaml_" + name + "_out");
  std::vector<std::string> argv = {HP_CLI_PATH, "train", write_yaml(name, yaml), "--nproc_per_node=1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const auto run = hp::testing::run_subprocess(argv);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  return hp::testing::trainer_runs::logged_losses(::testing::TempDir() + "hp_hpyaml_" + name + "_out");
}

}  // namespace

// dataset.data_path with HyperParallel's data_transform names a jsonl file by its path: the
// chats in it (fields renamed by text_keys / role_key / content_key, roles in either spelling)
// train exactly as the same chats registered in dataset_info.json; the texts of a plaintext
// transform (text_template) exactly as the rendered texts registered for stage pt.
TEST(HyperParallelYaml, ADataPathTrainsAsTheSameDataRegistered) {
  const std::string dir = ::testing::TempDir() + "hp_hpyaml_data";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string chats, registered, records, texts;
  for (int i = 0; i < 12; ++i) {
    const std::string q = "reverse " + std::to_string(i * 7) + " " + std::to_string(i + 3), a = std::to_string(i + 3) + " " + std::to_string(i * 7);
    const bool openai_roles = i % 2 == 1;
    chats += R"({"dialog": [{"speaker": ")" + std::string(openai_roles ? "user" : "human") + R"(", "text": ")" + q +
             R"("}, {"speaker": ")" + (openai_roles ? "assistant" : "gpt") + R"(", "text": ")" + a + R"("}]})" + "\n";
    registered += R"({"conversations": [{"from": "human", "value": ")" + q + R"("}, {"from": "gpt", "value": ")" + a + R"("}]})" + "\n";
    records += R"({"q": ")" + q + R"(", "n": )" + std::to_string(i) + R"(, "a": ")" + a + R"("})" + "\n";
    texts += R"({"text": "Q{)" + std::to_string(i) + R"(}: )" + q + R"(\nA: )" + a + R"("})" + "\n";
  }
  write_text(dir + "/chats.jsonl", chats);
  write_text(dir + "/registered.jsonl", registered);
  write_text(dir + "/records.jsonl", records);
  write_text(dir + "/texts.jsonl", texts);
  write_text(dir + "/dataset_info.json", R"({"chats": {"file_name": "registered.jsonl", "formatting": "sharegpt"},
    "texts": {"file_name": "texts.jsonl", "columns": {"prompt": "text"}}})");
  const std::string out = ::testing::TempDir() + "hp_hpyaml_";
  const auto by_path = losses_of("chat_path", small_job("  data_path: " + dir + "/chats.jsonl\n"
                                                        "  data_transform:\n    data_type: conversation\n    text_keys: dialog\n"
                                                        "    role_key: speaker\n    content_key: text\n    max_seq_len: 64\n",
                                                        out + "chat_path_out"));
  const auto by_name = losses_of("chat_name", small_job("  name: chats\n  dataset_dir: " + dir + "\n  data_config:\n    seq_length: 64\n",
                                                        out + "chat_name_out"));
  ASSERT_EQ(by_path.size(), 3u);
  EXPECT_EQ(by_path, by_name);
  const auto text_path = losses_of("text_path", small_job("  data_path: " + dir + "/records.jsonl\n"
                                                          "  data_transform:\n    data_type: plaintext\n"
                                                          "    text_template: \"Q{{{n}}}: {q}\\nA: {a}\"\n    max_seq_len: 16\n",
                                                          out + "text_path_out"));
  const auto text_name = losses_of("text_name", small_job("  name: texts\n  dataset_dir: " + dir + "\n  data_config:\n    seq_length: 16\n",
                                                          out + "text_name_out"), {"--stage=pt"});
  ASSERT_EQ(text_path.size(), 3u);
  EXPECT_EQ(text_path, text_name);
  EXPECT_NE(text_path, by_path);  // the texts are not the chats
}

// What a data_path cannot mean here fails before training with the key and the fix.
TEST(HyperParallelYaml, DataPathsThatCannotBeReadAreNamed) {
  const std::string out = ::testing::TempDir() + "hp_hpyaml_bad_data_out";
  const struct {
    std::string dataset, expected;
  } cases[] = {
      {"  data_path: Salesforce/wikitext\n  data_config:\n    hf_dataset_name: Salesforce/wikitext\n",
       "dataset.data_config.hf_dataset_name: nothing is downloaded here; save the dataset as a local .jsonl file"},
      {"  data_path: corpus_text_document\n  data_transform:\n    data_type: pretokenized\n",
       "dataset.data_transform.data_type: pretokenized (Megatron .bin/.idx) data is not read here"},
      {"  data_path: x.jsonl\n  data_transform:\n    data_type: conversation\n    text_keys: [messages, conversations]\n",
       "dataset.data_transform.text_keys: a list of fields to try in turn is not read here"},
      {"  data_path: x.jsonl\n  data_transform:\n    data_type: conversation\n    role_map: {bot: assistant}\n",
       "dataset.data_transform.role_map: role aliases are not read here"},
      {"  data_path: x.jsonl\n  data_transform:\n    data_type: conversation\n    text_template: \"{a}\"\n",
       "dataset_file.text_template renders the texts of stage pt"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.dataset);
    EXPECT_NE(user_error_of(write_yaml("bad_data", small_job(c.dataset, out))).find(c.expected), std::string::npos)
        << user_error_of(write_yaml("bad_data", small_job(c.dataset, out)));
  }
  // A missing file is named at the start of the run, exit code 2.
  const auto run = hp::testing::run_subprocess(
      {HP_CLI_PATH, "train", write_yaml("missing", small_job("  data_path: /nonexistent/chats.jsonl\n", out)), "--nproc_per_node=1"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("dataset_file.path: file /nonexistent/chats.jsonl does not exist"), std::string::npos) << run.output;
  // mock_data wins over a data_path, as in HyperParallel; the path is listed as ignored.
  const hp::train::TrainConfig mock = hp::train::load_train_config(
      write_yaml("mock", small_job("  data_path: x.jsonl\n  data_transform:\n    data_type: plaintext\n"
                                   "  data_config:\n    mock_data: true\n", out)), {});
  EXPECT_EQ(mock.dataset, "synthetic_reverse");
  EXPECT_TRUE(mock.dataset_file.path.empty());
  EXPECT_EQ(mock.stage, "sft");
  EXPECT_TRUE(ignored(mock, "dataset.data_path"));
}
