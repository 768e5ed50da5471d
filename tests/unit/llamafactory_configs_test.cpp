// LlamaFactory's own configs and conventions: upstream example YAMLs run with only their paths
// changed, every foreign key has a documented disposition, all problems of a file come in one
// run, key=value overrides and LlamaFactory's launch variables, hyper_parallel_args JSON, and
// HF's learning-rate schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <regex>
#include <sstream>
#include <set>

#include <yaml-cpp/yaml.h>

#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/train/lr_schedule.h"
#include "hyperparallel/train/train_config.h"
#include "support/hf_folder.h"
#include "support/subprocess.h"
#include "support/test_files.h"
#include "train/llamafactory_compat.h"
#include "train/tensorboard_writer.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;

namespace {

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "hp_lf_" + name; }

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = temp_path(name);
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

const std::string kFixtures = HP_SOURCE_DIR "/tests/fixtures/llamafactory/";

// An upstream YAML with the three lines a user changes replaced; everything else verbatim.
std::string upstream_with_paths(const std::string& file, const std::string& model, const std::string& output_dir) {
  std::string text = hp::testing::read_text_file(kFixtures + file);
  EXPECT_FALSE(text.empty()) << file;
  text = std::regex_replace(text, std::regex("(^|\n)model_name_or_path: [^\n]*"), "$1model_name_or_path: " + model);
  text = std::regex_replace(text, std::regex("(^|\n)output_dir: [^\n]*"), "$1output_dir: " + output_dir);
  return text + "dataset_dir: " + kFixtures + "data\n";
}

std::vector<nlohmann::json> log_lines(const std::string& dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(dir + "/trainer_log.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

hp::train::TrainConfig load(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return hp::train::load_train_config(write_file("load.yaml", yaml), overrides);
}

const std::string kMinimal = "model_name_or_path: qwen3-debug\ndataset: synthetic_reverse\ntemplate: qwen3\noutput_dir: /tmp/x\n";

// What LlamaFactory's and HF's tools read after a run of `steps` steps, logged every step.
void check_llamafactory_outputs(const std::string& out, int64_t steps) {
  const auto lines = log_lines(out);
  ASSERT_EQ(static_cast<int64_t>(lines.size()), steps);
  int64_t tokens = 0;
  for (const auto& line : lines) {
    for (const char* key : {"current_steps", "total_steps", "percentage", "elapsed_time", "remaining_time", "throughput",
                            "total_tokens", "loss", "lr", "epoch", "peak_rss_mib", "mfu"}) {
      EXPECT_TRUE(line.contains(key)) << key << " in " << line.dump();
    }
    EXPECT_EQ(line["total_steps"], steps);
    EXPECT_GT(line["total_tokens"].get<int64_t>(), tokens);  // grows every step
    tokens = line["total_tokens"].get<int64_t>();
    EXPECT_TRUE(std::regex_match(line["elapsed_time"].get<std::string>(), std::regex("\\d+:\\d\\d:\\d\\d")));
    EXPECT_GT(line["mfu"].get<double>(), 0);
    EXPECT_GT(line["peak_rss_mib"].get<double>(), 10);
  }
  EXPECT_EQ(lines.back()["percentage"], 100.0);
  const auto state = nlohmann::json::parse(std::ifstream(out + "/trainer_state.json"));
  EXPECT_EQ(state["global_step"], steps);
  EXPECT_EQ(state["num_input_tokens_seen"], tokens);
  ASSERT_EQ(static_cast<int64_t>(state["log_history"].size()), steps + 1);
  for (int64_t i = 0; i < steps; ++i) {
    EXPECT_EQ(state["log_history"][i]["loss"], lines[i]["loss"]);
    EXPECT_EQ(state["log_history"][i]["learning_rate"], lines[i]["lr"]);
    EXPECT_EQ(state["log_history"][i]["step"], i + 1);
  }
  const auto results = nlohmann::json::parse(std::ifstream(out + "/train_results.json"));
  EXPECT_EQ(results, nlohmann::json::parse(std::ifstream(out + "/all_results.json")));
  for (const char* key : {"epoch", "total_flos", "train_loss", "train_runtime", "train_samples_per_second", "train_steps_per_second"}) {
    EXPECT_TRUE(results.contains(key)) << key;
    EXPECT_EQ(state["log_history"].back()[key], results[key]) << key;
  }
  double mean_loss = 0;
  for (const auto& line : lines) mean_loss += line["loss"].get<double>() / static_cast<double>(steps);
  EXPECT_NEAR(results["train_loss"].get<double>(), mean_loss, 1e-9);
  // The exported folder: generation_config.json and a chat template.
  const auto generation = nlohmann::json::parse(std::ifstream(out + "/generation_config.json"));
  EXPECT_TRUE(generation.contains("eos_token_id")) << generation.dump();
  const auto tokenizer_config = nlohmann::json::parse(std::ifstream(out + "/tokenizer_config.json"));
  EXPECT_TRUE(tokenizer_config.contains("chat_template") && tokenizer_config["chat_template"].is_string());
}

}  // namespace

// LlamaFactory's train_full and FSDP examples, byte for byte apart from the paths: they train,
// list what they ignore once, and export.
TEST(LlamaFactoryConfigs, UpstreamExamplesRunWithOnlyTheirPathsChanged) {
  const std::string model = hp::testing::write_tiny_hf_folder(temp_path("model"));
  for (const std::string file : {"train_full_qwen3_full_sft.yaml", "ascend_qwen3_full_sft_fsdp2.yaml", "ascend_qwen3moe_full_sft_fsdp.yaml"}) {
    SCOPED_TRACE(file);
    const std::string out = temp_path("out_" + file);
    fs::remove_all(out);
    const std::string yaml = write_file(file, upstream_with_paths(file, model, out));
    // max_steps in LlamaFactory's key=value form keeps the test short; the file is unchanged.
    const auto run = hp::testing::run_subprocess({HP_CLI_PATH, "train", yaml, "max_steps=3", "logging_steps=1"},
                                                 {std::chrono::seconds(180)});
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(log_lines(out).size(), 3u) << run.output;
    EXPECT_NE(run.output.find("ignored (no effect here; docs/config.md):"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("  dataloader_num_workers: "), std::string::npos) << run.output;
    EXPECT_EQ(run.output.find("step 4/"), std::string::npos) << run.output;
    EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
    check_llamafactory_outputs(out, 3);
    fs::remove_all(out);
  }
}

// The upstream example with its commented-out eval block switched on: val_size splits rows off
// the training data, eval_loss is logged every eval_steps and after the last step, and lands
// in eval_results.json, all_results.json and trainer_state.json's log_history.
TEST(LlamaFactoryConfigs, TheUpstreamEvalBlockEvaluatesOnAValidationSplit) {
  const std::string model = hp::testing::write_tiny_hf_folder(temp_path("model"));
  const std::string out = temp_path("eval_out");
  fs::remove_all(out);
  std::string text = upstream_with_paths("train_full_qwen3_full_sft.yaml", model, out);
  for (const char* key : {"val_size", "per_device_eval_batch_size", "eval_strategy", "eval_steps"}) {
    text = std::regex_replace(text, std::regex(std::string("\n# ") + key + ":"), std::string("\n") + key + ":");
  }
  const std::string yaml = write_file("eval.yaml", text);
  const auto run = hp::testing::run_subprocess({HP_CLI_PATH, "train", yaml, "max_steps=4", "eval_steps=2", "logging_steps=1"},
                                               {std::chrono::seconds(180)});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // 24 conversations: ceil(0.1 x 24) = 3 rows held out, 21 to train on.
  EXPECT_NE(run.output.find("24 conversations -> 21 rows, 3 eval rows"), std::string::npos) << run.output;
  std::vector<int64_t> eval_steps;
  for (const auto& line : log_lines(out)) {
    if (line.contains("eval_loss")) eval_steps.push_back(line["step"]);
  }
  EXPECT_EQ(eval_steps, (std::vector<int64_t>{2, 4}));
  const auto results = nlohmann::json::parse(std::ifstream(out + "/eval_results.json"));
  const auto all = nlohmann::json::parse(std::ifstream(out + "/all_results.json"));
  EXPECT_GT(results["eval_loss"].get<double>(), 0);
  EXPECT_EQ(all["eval_loss"], results["eval_loss"]);
  EXPECT_TRUE(all.contains("train_loss"));
  int64_t history_evals = 0;
  const auto state = nlohmann::json::parse(std::ifstream(out + "/trainer_state.json"));
  for (const auto& entry : state["log_history"]) history_evals += entry.contains("eval_loss");
  EXPECT_EQ(history_evals, 2);
  // Asking for evaluation without eval rows, or with both sources, is refused before training.
  const auto none = hp::testing::run_subprocess({HP_CLI_PATH, "train", yaml, "val_size=0", "output_dir=" + temp_path("eval_none")});
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("eval_strategy: steps needs rows to evaluate: set eval_dataset"), std::string::npos) << none.output;
  const auto both = hp::testing::run_subprocess({HP_CLI_PATH, "train", yaml, "eval_dataset=identity", "output_dir=" + temp_path("eval_none")});
  EXPECT_EQ(both.exit_code, 2) << both.output;
  EXPECT_NE(both.output.find("val_size and eval_dataset both say"), std::string::npos) << both.output;
  const auto all_rows = hp::testing::run_subprocess({HP_CLI_PATH, "train", yaml, "val_size=24", "output_dir=" + temp_path("eval_none")});
  EXPECT_EQ(all_rows.exit_code, 2) << all_rows.output;
  EXPECT_NE(all_rows.output.find("val_size 24"), std::string::npos) << all_rows.output;
  fs::remove_all(out);
}

// A file with several mistakes gets every one of them in one run, each naming its key.
TEST(LlamaFactoryConfigs, EveryProblemOfAFileIsReportedInOneRun) {
  const std::string yaml = write_file("problems.yaml", kMinimal +
                                                           "quantization_bit: 4\n"
                                                           "lora_rank: 8\n"  // ignored: no problem
                                                           "learning_rat: 1.0e-4\n"
                                                           "use_galore: true\n"
                                                           "use_badam: false\n"  // off: no problem
                                                           "cutoff_len: long\n");
  const auto run = hp::testing::run_subprocess({HP_CLI_PATH, "train", yaml, "--label_smoothing_factor=0.1"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("5 problems in the configuration:"), std::string::npos) << run.output;
  for (const char* expected : {"quantization_bit is not supported: quantized training", "unknown key 'learning_rat' (did you mean 'learning_rate'?)",
                               "use_galore is not supported: only AdamW", "cutoff_len: 'long' is not allowed",
                               "command line: label_smoothing_factor is not supported"}) {
    EXPECT_NE(run.output.find(expected), std::string::npos) << expected << "\n" << run.output;
  }
  EXPECT_EQ(run.output.find("lora_rank"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("use_badam"), std::string::npos) << run.output;
  // The fp8 example asks for what a CPU cannot do: refused with the fix, not half-run.
  const std::string fp8 = write_file("fp8.yaml", upstream_with_paths("extras_fp8_llama3_fp8_fsdp_sft.yaml", "qwen3-debug", temp_path("fp8_out")));
  const auto refused = hp::testing::run_subprocess({HP_CLI_PATH, "train", fp8});
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("fp8 is not supported: fp8 is not supported on CPU; use bf16: true"), std::string::npos) << refused.output;
  EXPECT_FALSE(fs::exists(temp_path("fp8_out")));
}

TEST(LlamaFactoryConfigs, EveryForeignKeyIsDocumentedAndNoneShadowsOurs) {
  const std::string docs = hp::testing::read_text_file(HP_SOURCE_DIR "/docs/config.md");
  std::set<std::string> seen;
  for (const auto& k : hp::train::compat::foreign_keys()) {
    EXPECT_NE(docs.find("`" + k.key + "`"), std::string::npos) << k.key;
    EXPECT_TRUE(seen.insert(k.key).second) << k.key << " is classified twice";
    for (const auto& ours : hp::train::config_schema()) EXPECT_NE(ours.key, k.key);
  }
  EXPECT_GE(seen.size(), 250u);
}

TEST(LlamaFactoryConfigs, ForeignValuesTurnFeaturesOnOnlyWhenTheySayYes) {
  using hp::train::compat::turns_on;
  for (const char* off : {"false", "no", "0", "0.0", "none", "null", "~", "''", "[]"}) EXPECT_FALSE(turns_on(YAML::Load(off))) << off;
  for (const char* on : {"true", "4", "0.1", "fa2", "[q_proj]", "{a: 1}"}) EXPECT_TRUE(turns_on(YAML::Load(on))) << on;
}

TEST(LlamaFactoryConfigs, KeysWithAnEffectMapOntoOurs) {
  const auto c = load(kMinimal + "ddp_timeout: 180000000\nneat_packing: true\nsave_strategy: \"no\"\noptim: adamw_torch_fused\n"
                                 "report_to: [wandb, tensorboard]\ndeepspeed: examples/deepspeed/ds_z3_config.json\n"
                                 "hyper_parallel_cp_size: 1\nlr_scheduler_type: cosine_with_min_lr\n"
                                 "lr_scheduler_kwargs: '{\"min_lr_rate\": 0.1}'\ndataloader_num_workers: 4\n");
  EXPECT_EQ(c.comm_timeout_s, 7 * 24 * 3600);  // LlamaFactory's "forever" is a week
  EXPECT_TRUE(c.packing);
  EXPECT_FALSE(c.save_checkpoints);
  EXPECT_EQ(c.lr_scheduler_kwargs.min_lr_rate, 0.1);
  std::vector<std::string> ignored;
  for (const auto& [key, why] : c.ignored_keys) ignored.push_back(key);
  EXPECT_EQ(ignored, (std::vector<std::string>{"deepspeed", "dataloader_num_workers", "report_to: wandb"}));  // tensorboard is written
  EXPECT_TRUE(load(kMinimal + "report_to: none\n").ignored_keys.empty());
}

// llamafactory-cli's override form and launch variables.
TEST(LlamaFactoryConfigs, KeyValueOverridesAndNprocPerNodeFromTheEnvironment) {
  const std::string out = temp_path("env_out");
  fs::remove_all(out);
  const std::string yaml = write_file("env.yaml", kMinimal + "tokenizer: " HP_SOURCE_DIR "/examples/tokenizer\nmax_samples: 64\n"
                                                             "per_device_train_batch_size: 2\nmax_steps: 50\n");
  const auto run = hp::testing::run_subprocess(
      {"/usr/bin/env", "NPROC_PER_NODE=2", HP_CLI_PATH, "train", yaml, "max_steps=2", "output_dir=" + out, "logging_steps=1"},
      {std::chrono::seconds(120)});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("hyperparallel train: 2 ranks"), std::string::npos) << run.output;
  EXPECT_EQ(log_lines(out).size(), 2u);
  fs::remove_all(out);
  const auto bad = hp::testing::run_subprocess({"/usr/bin/env", "NNODES=2", "NODE_RANK=0", HP_CLI_PATH, "train", yaml, "output_dir=" + out});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("NNODES=2 needs MASTER_ADDR"), std::string::npos) << bad.output;
  const auto stray = hp::testing::run_subprocess({HP_CLI_PATH, "train", yaml, "=3"});
  EXPECT_EQ(stray.exit_code, 2) << stray.output;
  EXPECT_NE(stray.output.find("unexpected argument '=3'"), std::string::npos) << stray.output;
}

TEST(LlamaFactoryConfigs, HyperParallelArgsJsonSetsOurKeys) {
  const std::string json = write_file("hp_args.json", R"({"tp_size": 2, "fsdp_size": 2, "param_dtype": "bf16", "reduce_dtype": "fp32",
      "reshard_after_forward": false, "activation_mode": "recompute", "device_type": "auto", "efsdp_size": null})");
  const auto c = load(kMinimal + "use_hyper_parallel: true\nhyper_parallel_args: " + json + "\n");
  EXPECT_EQ(c.accelerator.tp_size, 2);
  EXPECT_EQ(c.fsdp_config.dp_shard_size, 2);
  EXPECT_EQ(c.fsdp_config.mix_precision.param_dtype, "bfloat16");
  EXPECT_EQ(c.fsdp_config.mix_precision.reduce_dtype, "float32");
  EXPECT_EQ(c.fsdp_config.reshard_after_forward, 0);
  EXPECT_EQ(c.activation_checkpoint.mode, "full");  // activation_mode: recompute
  // The command line still wins over the file.
  EXPECT_EQ(load(kMinimal + "hyper_parallel_args: " + json + "\n", {"accelerator.tp_size=1"}).accelerator.tp_size, 1);
  const auto fails = [&](const std::string& yaml, const std::string& expected) {
    SCOPED_TRACE(yaml);
    try {
      load(yaml);
      ADD_FAILURE() << "no error";
    } catch (const hp::UserError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  fails(kMinimal + "hyper_parallel_args: " + json + "\naccelerator:\n  tp_size: 4\n", "accelerator.tp_size is '4' but hyper_parallel_args");
  fails(kMinimal + "hyper_parallel_args: " + write_file("a.json", R"({"tp_sise": 2})") + "\n", "'tp_sise' is not a HyperParallelArguments field (did you mean 'tp_size'?)");
  fails(kMinimal + "hyper_parallel_args: " + write_file("b.json", R"({"param_dtype": "fp16"})") + "\n", "float16 is not supported");
  fails(kMinimal + "hyper_parallel_args: " + write_file("c.json", R"({"device_type": "npu"})") + "\n", "this build runs on the CPU");
  EXPECT_EQ(load(kMinimal + "hyper_parallel_args: " + write_file("d.json", R"({"cp_size": 2})") + "\n").accelerator.cp_size, 2);
  EXPECT_EQ(load(kMinimal + "hyper_parallel_cp_size: 4\n").accelerator.cp_size, 4);
  fails(kMinimal + "hyper_parallel_args: " + write_file("e.json", R"([1, 2])") + "\n", "must hold a JSON object");
  fails(kMinimal + "hyper_parallel_args: " + write_file("f.json", R"({"tp_size": 0})") + "\n", "accelerator.tp_size: '0' is not allowed");
}

// report_to: tensorboard writes TensorBoard's event files: framing and CRCs checked and every
// record parsed by the protobuf runtime (tests/support/read_tfevents.py); the scalars are the
// logged numbers.
TEST(LlamaFactoryConfigs, ReportToTensorboardWritesEventFilesTensorBoardReads) {
  EXPECT_EQ(hp::train::crc32c("123456789", 9), 0xE3069283u);
  const std::string out = temp_path("tensorboard_out");
  fs::remove_all(out);
  const std::string yaml = write_file("tb.yaml", kMinimal + "tokenizer: " HP_SOURCE_DIR "/examples/tokenizer\nmax_samples: 32\n"
                                                            "max_steps: 4\nlogging_steps: 2\nreport_to: [tensorboard, wandb]\n");
  const auto run = hp::testing::run_subprocess({HP_CLI_PATH, "train", yaml, "output_dir=" + out}, {std::chrono::seconds(120)});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("  report_to: wandb: no experiment tracker is contacted"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("report_to: tensorboard:"), std::string::npos) << run.output;
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(out + "/runs")) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(e.path().string());
  }
  ASSERT_EQ(files.size(), 1u);
  EXPECT_NE(run.output.find("TensorBoard: " + files[0]), std::string::npos) << run.output;
  const std::string parsed = temp_path("tensorboard.json");
  const auto reader = hp::testing::run_subprocess({"/usr/bin/python3", HP_SOURCE_DIR "/tests/support/read_tfevents.py", files[0], parsed});
  ASSERT_EQ(reader.exit_code, 0) << reader.output << "(scripts/setup.sh installs python3-protobuf)";
  const auto events = nlohmann::json::parse(std::ifstream(parsed));
  EXPECT_EQ(events["file_version"], "brain.Event:2");
  std::map<std::pair<int64_t, std::string>, double> scalars;
  for (const auto& s : events["scalars"]) scalars[{s[0].get<int64_t>(), s[1].get<std::string>()}] = s[2].get<double>();
  const auto lines = log_lines(out);
  ASSERT_EQ(lines.size(), 2u);
  for (const auto& line : lines) {
    const int64_t step = line["step"];
    EXPECT_FLOAT_EQ(scalars.at({step, "train/loss"}), line["loss"].get<double>());
    EXPECT_FLOAT_EQ(scalars.at({step, "train/learning_rate"}), line["lr"].get<double>());
    EXPECT_FLOAT_EQ(scalars.at({step, "train/grad_norm"}), line["grad_norm"].get<double>());
  }
  EXPECT_TRUE(scalars.count({4, "train/train_runtime"}));
  // logging_dir puts them where it says.
  const std::string custom = temp_path("tensorboard_custom");
  fs::remove_all(custom);
  const auto again = hp::testing::run_subprocess({HP_CLI_PATH, "train", yaml, "output_dir=" + out, "overwrite_output_dir=true",
                                                  "logging_dir=" + custom, "report_to=all"},
                                                 {std::chrono::seconds(120)});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_FALSE(fs::is_empty(custom));
  fs::remove_all(out);
  fs::remove_all(custom);
}

// The rates of HF's get_scheduler, worked by hand from its formulas.
TEST(LlamaFactoryConfigs, LearningRateSchedulesFollowHuggingFace) {
  using hp::train::LrSchedule;
  LrSchedule min_lr{"cosine_with_min_lr", 1e-3, 2, 10};
  min_lr.min_lr_rate = 0.1;
  EXPECT_DOUBLE_EQ(min_lr.lr_at(1), 5e-4);  // warmup
  EXPECT_DOUBLE_EQ(min_lr.lr_at(2), 1e-3);
  EXPECT_NEAR(min_lr.lr_at(6), 1e-3 * (0.5 * 0.9 + 0.1), 1e-15);  // progress 0.5: factor 0.5
  EXPECT_NEAR(min_lr.lr_at(10), 1e-4, 1e-15);                      // the floor, not 0
  LrSchedule poly{"polynomial", 1e-3, 2, 10};
  poly.lr_end = 1e-4;
  poly.power = 2;
  EXPECT_NEAR(poly.lr_at(6), 0.9e-3 * 0.25 + 1e-4, 1e-15);
  EXPECT_NEAR(poly.lr_at(10), 1e-4, 1e-15);
  EXPECT_NEAR(poly.lr_at(11), 1e-4, 1e-15);
  LrSchedule restarts{"cosine_with_restarts", 1e-3, 0, 8};
  restarts.num_cycles = 2;
  EXPECT_NEAR(restarts.lr_at(0), 1e-3, 1e-15);
  EXPECT_NEAR(restarts.lr_at(2), 0.5e-3, 1e-15);  // progress 0.25: half way down the first cycle
  EXPECT_NEAR(restarts.lr_at(4), 1e-3, 1e-15);    // restart
  EXPECT_EQ(restarts.lr_at(8), 0.0);
  LrSchedule cosine{"cosine", 1e-3, 0, 4};
  EXPECT_NEAR(cosine.lr_at(2), 0.5e-3, 1e-15);
  // The trainer builds min_lr_rate from min_lr as HF does (min_lr / learning_rate).
  const auto c = load(kMinimal + "learning_rate: 2.0e-4\nlr_scheduler_type: cosine_with_min_lr\nlr_scheduler_kwargs: {min_lr: 2.0e-5}\n");
  EXPECT_EQ(c.lr_scheduler_kwargs.min_lr, 2e-5);
}
