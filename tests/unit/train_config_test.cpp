// The trainer's configuration: the frozen schema, its documentation, precedence, and the
// one-line exit-code-2 error of every bad config.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "hyperparallel/platform/bf16_matmul.h"
#include "hyperparallel/platform/cpu_features.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/models/model_config.h"
#include "hyperparallel/train/train_config.h"
#include "support/subprocess.h"
#include "train/loss_chunking.h"
#include "support/test_files.h"

namespace hp = hyperparallel;

namespace {

std::string write_yaml(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "hp_config_" + name + ".yaml";
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

const std::string kValid =
    "model_name_or_path: qwen3-debug\n"
    "tokenizer: " HP_SOURCE_DIR "/examples/tokenizer\n"
    "dataset: synthetic_reverse\n"
    "template: qwen3\n"
    "max_samples: 64\n"
    "max_steps: 1\n";

// kValid without its line for `key`.
std::string valid_without(const std::string& key) {
  std::string out;
  std::istringstream in(kValid);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) != 0) out += line + "\n";
  }
  return out;
}

}  // namespace

TEST(TrainConfig, SchemaIsFrozen) {
  // A change here changes what users' YAML files mean: update the fixture and docs/config.md.
  EXPECT_EQ(hp::train::config_schema_text(), hp::testing::read_text_file(HP_SOURCE_DIR "/tests/fixtures/config_schema.txt"));
}

TEST(TrainConfig, EveryKeyIsDocumented) {
  const std::string docs = hp::testing::read_text_file(HP_SOURCE_DIR "/docs/config.md");
  EXPECT_GE(hp::train::config_schema().size(), 50u);
  for (const auto& key : hp::train::config_schema()) EXPECT_NE(docs.find("`" + key.key + "`"), std::string::npos) << key.key;
}

TEST(TrainConfig, CommandLineOverYamlOverDefaults) {
  const std::string path = write_yaml("precedence", kValid +
                                                        "output_dir: /tmp/x\n"
                                                        "learning_rate: 1.0e-4\n"
                                                        "save_total_limit: ~\n"
                                                        "fsdp_config:\n  dp_shard_size: 2\n  reshard_after_forward: 4\n"
                                                        "  mix_precision: {param_dtype: bfloat16}\n"
                                                        "  replicate_params: ['*norm*']\n"
                                                        "plan_overrides:\n  - {match: '*', module_type: Qwen3RMSNorm, replace_module: fused_rms_norm}\n");
  const auto c = hp::train::load_train_config(path, {"learning_rate=3e-4", "fsdp_config.comm_fusion=false", "max_samples=null"});
  EXPECT_DOUBLE_EQ(c.learning_rate, 3e-4);
  EXPECT_FALSE(c.fsdp_config.comm_fusion);
  EXPECT_EQ(c.fsdp_config.dp_shard_size, 2);
  EXPECT_EQ(c.fsdp_config.reshard_after_forward, 4);
  EXPECT_EQ(c.fsdp_config.mix_precision.param_dtype, "bfloat16");
  EXPECT_EQ(c.fsdp_config.replicate_params, std::vector<std::string>{"*norm*"});
  ASSERT_EQ(c.plan_overrides.size(), 1u);
  EXPECT_EQ(c.plan_overrides[0].replace_module, "fused_rms_norm");
  EXPECT_FALSE(c.max_samples.has_value());  // null on the command line: back to the default
  EXPECT_FALSE(c.save_total_limit.has_value());
  EXPECT_EQ(c.lr_scheduler_type, "linear");  // default
  EXPECT_EQ(c.per_device_train_batch_size, 1);
  const auto automatic = hp::train::load_train_config(path, {"bf16=auto"});
  EXPECT_TRUE(automatic.bf16_auto);  // resolved by the trainer, from every rank's CPU
  EXPECT_FALSE(automatic.bf16);
  EXPECT_TRUE(hp::train::load_train_config(path, {"bf16=true"}).bf16);
}

// bf16: auto reads the kernel's flags: AVX512_BF16 or AMX-BF16 make bf16 fast.
TEST(TrainConfig, CpuFlagsDecideWhetherBf16IsFast) {
  const auto cpu = [](const std::string& flags) {
    return hp::platform::parse_cpuinfo("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu " + flags +
                                       " sse\n\nprocessor\t: 1\nflags\t\t: avx512_bf16 amx_bf16\n");
  };
  EXPECT_EQ(cpu("").model_name, "Some CPU");
  EXPECT_FALSE(cpu("avx2 avx512f").fast_bf16());  // the second processor's flags are not read
  EXPECT_TRUE(cpu("avx512f avx512_bf16").fast_bf16());
  EXPECT_TRUE(cpu("amx_tile amx_bf16").fast_bf16());
  EXPECT_FALSE(cpu("avx512_bf16x").fast_bf16());
  EXPECT_FALSE(hp::platform::parse_cpuinfo("").fast_bf16());
}

// The accuracy probe must answer for the products a model runs: a [128 x 512] x [512 x 256]
// bf16 product of random values is within bf16 rounding of fp32 exactly when the probe says
// the matmul accumulates in fp32 (a probe too small for oneDNN once read "bf16" on an
// AVX-512 CPU whose model-sized products were accurate).
TEST(TrainConfig, Bf16MatmulProbeAnswersForModelSizedProducts) {
  auto gen = at::detail::createCPUGenerator(5);
  const at::Tensor a = at::rand({128, 512}, gen).to(at::kBFloat16), b = at::rand({512, 256}, gen).to(at::kBFloat16);
  const at::Tensor exact = at::mm(a.to(at::kFloat), b.to(at::kFloat));
  const double error = ((at::mm(a, b).to(at::kFloat) - exact).abs() / exact).max().item<double>();
  // fp32 accumulation: one bf16 rounding of the result (2^-8); bf16 accumulation of 512
  // positive terms of ~0.25 loses far more.
  EXPECT_EQ(hp::platform::bf16_matmul_accumulates_in_fp32(), error < 1e-2) << "largest relative error " << error;
}

// Each bad config: exit code 2 and one line that names the key (or the thing) at fault.
TEST(TrainConfig, BadConfigsFailWithExitCode2NamingTheKey) {
  const std::string out = "output_dir: " + ::testing::TempDir() + "hp_config_out\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"learning_rat: 1.0e-4\n", "unknown key 'learning_rat' (did you mean 'learning_rate'?)"},
      {"fsdp_config:\n  dp_shard: 2\n", "unknown key 'fsdp_config.dp_shard' (did you mean 'fsdp_config.dp_shard_size'?)"},
      {"dp_shard_size: 2\n", "unknown key 'dp_shard_size' (did you mean 'fsdp_config.dp_shard_size'?)"},
      {"learning_rate: fast\n", "learning_rate: 'fast' is not allowed; expected a number > 0"},
      {"learning_rate: -1\n", "learning_rate: '-1' is not allowed"},
      {"learning_rate: .nan\n", "learning_rate: '.nan' is not allowed"},
      {"per_device_train_batch_size: 0\n", "per_device_train_batch_size: '0' is not allowed; expected an integer >= 1"},
      {"per_device_train_batch_size: 2.5\n", "per_device_train_batch_size: '2.5'"},
      {"gradient_accumulation_steps: [1, 2]\n", "gradient_accumulation_steps: a list is not allowed"},
      {"cutoff_len: 1\n", "cutoff_len: '1' is not allowed; expected an integer >= 2"},
      {"max_steps: 0\n", "max_steps: '0' is not allowed; expected -1 or an integer >= 1"},
      {"num_train_epochs: 0\n", "num_train_epochs: '0'"},
      {"warmup_ratio: 1.5\n", "warmup_ratio: '1.5' is not allowed; expected a number in [0, 1)"},
      {"adam_beta2: 1\n", "adam_beta2: '1' is not allowed"},
      {"adam_epsilon: 0\n", "adam_epsilon: '0'"},
      {"weight_decay: -0.1\n", "weight_decay: '-0.1'"},
      {"max_grad_norm: -1\n", "max_grad_norm: '-1'"},
      {"logging_steps: 0\n", "logging_steps: '0'"},
      {"save_total_limit: 0\n", "save_total_limit: '0'"},
      {"seed: -3\n", "seed: '-3'"},
      {"lr_scheduler_type: cosin\n", "lr_scheduler_type: 'cosin' is not allowed; expected linear | cosine | cosine_with_min_lr | cosine_with_restarts | polynomial | constant | constant_with_warmup (did you mean 'cosine'?)"},
      {"packing: maybe\n", "packing: 'maybe' is not allowed; expected true or false"},
      {"bf16: maybe\n", "bf16: 'maybe' is not allowed; expected true, false or auto"},
      {"fp16: true\n", "fp16: true is not supported: CPU kernels have no fast float16 matmul"},
      {"bad_records: ignore\n", "bad_records: 'ignore'"},
      {"stage: pt\n", "dataset 'synthetic_reverse' is a built-in chat dataset, and stage pt trains on plain text"},
      {"finetuning_type: lora\n", "finetuning_type: lora is not supported yet"},
      {"dataset_file:\n  column: dialog\n", "dataset_file.column describes the file dataset_file.path names; set dataset_file.path"},
      {"dataset_file:\n  path: x.jsonl\n  text_template: \"{a}\"\n", "dataset_file.text_template renders the texts of stage pt"},
      {"dataset_file:\n  path: x.jsonl\n  formatting: csv\n", "dataset_file.formatting: 'csv' is not allowed; expected auto | alpaca | sharegpt | openai"},
      {"use_hyper_parallel: false\n", "use_hyper_parallel: false"},
      {"accelerator:\n  cp_algorithm: ulysses\n", "accelerator.cp_algorithm and ulysses_degree apply with context parallelism (cp_size > 1)"},
      {"accelerator:\n  cp_size: 4\n  cp_algorithm: hybrid\n", "accelerator.cp_algorithm hybrid needs ulysses_degree between 1 and cp_size 4"},
      {"accelerator:\n  cp_size: 4\n  cp_algorithm: zigzag\n", "accelerator.cp_algorithm: 'zigzag' is not allowed; expected ulysses | allgather | ring | hybrid"},
      {"accelerator:\n  cp_size: 4\n  ulysses_degree: 3\n", "accelerator.ulysses_degree 3 does not divide cp_size 4"},
      {"accelerator:\n  pp_size: 2\n", "accelerator.tp_size 1 x pp_size 2 = 2 does not divide the world size 1"},
      {"accelerator:\n  pp_schedule: gpipe\n", "accelerator.pp_schedule, pp_virtual_stages, pp_microbatches and pp_layers apply with pipeline parallelism"},
      {"accelerator:\n  pp_size: 2\n  pp_schedule: zb\n", "accelerator.pp_schedule: 'zb' is not allowed; expected gpipe | 1f1b | interleaved_1f1b | zero_bubble"},
      {"accelerator:\n  pp_size: 2\n  pp_virtual_stages: 2\n", "accelerator.pp_virtual_stages > 1 needs pp_schedule: interleaved_1f1b"},
      {"gradient_accumulation_steps: 2\naccelerator:\n  pp_size: 2\n  pp_microbatches: 4\n", "accelerator.pp_microbatches 4 and gradient_accumulation_steps 2 both set"},
      {"accelerator:\n  pp_size: 2\n  pp_layers: {a: 1}\n", "accelerator.pp_layers: a mapping is not allowed; expected a list of layer ranges like 0-7"},
      {"muon_config:\n  momentum: 0.9\n", "muon_config applies with optim: muon (optim is adamw_torch)"},
      {"optimizer_offload:\n  dir: /nonexistent/offload\n", "optimizer_offload.dir: cannot create a file in /nonexistent/offload"},
      {"activation_checkpoint:\n  swap_inputs: true\n", "activation_checkpoint.swap_inputs moves the inputs full checkpointing keeps, and the mode is off"},
      {"optim: muon\nmuon_config:\n  adjust_lr: rms\n", "muon_config.adjust_lr: 'rms' is not allowed; expected match_rms_adamw | original"},
      {"accelerator:\n  cp_size: 2\n", "accelerator.tp_size 1 x cp_size 2 = 2 does not divide the world size 1"},
      {"accelerator:\n  sequence_parallel: true\n", "accelerator.sequence_parallel needs tp_size > 1"},
      {"accelerator:\n  loss_parallel: true\n", "accelerator.loss_parallel needs tp_size > 1"},
      {"accelerator:\n  pp_size: 0\n", "accelerator.pp_size: '0' is not allowed"},
      {"fsdp_config: 4\n", "fsdp_config must be a mapping"},
      {"fsdp_config:\n  dp_shard_size: 0\n", "fsdp_config.dp_shard_size: '0' is not allowed; expected -1 or an integer >= 1"},
      {"fsdp_config:\n  dp_shard_size: 3\n", "fsdp_config.dp_shard_size: 3 does not divide the 1 data-parallel ranks (world 1 / tp_size 1)"},
      {"accelerator:\n  tp_size: 3\n", "accelerator.tp_size 3 does not divide the world size 1; use a divisor of it"},
      {"fsdp_config:\n  reshard_after_forward: 1\n", "fsdp_config.reshard_after_forward: '1' is not allowed; expected true, false or an integer >= 2"},
      {"fsdp_config:\n  mix_precision:\n    param_dtype: float16\n", "fsdp_config.mix_precision.param_dtype: 'float16' is not allowed; expected float32 | bfloat16"},
      {"fsdp_config:\n  edp_shard_size: 2\n", "fsdp_config.edp_shard_size applies with expert parallelism (accelerator.ep_size > 1)"},
      {"accelerator:\n  tp_size: 2\n  sequence_parallel: true\n  loss_parallel: true\nchunked_loss:\n  enabled: true\n",
       "chunked_loss with sequence_parallel and loss_parallel is not supported yet"},
      {"chunked_loss:\n  chunk_size: 0\n", "chunked_loss.chunk_size: '0' is not allowed; expected an integer >= 1"},
      {"activation_checkpoint:\n  mode: partial\n", "activation_checkpoint.mode: 'partial' is not allowed; expected off | full | selective"},
      {"activation_checkpoint:\n  selective_policy: matmul\n", "activation_checkpoint.selective_policy: 'matmul' is not allowed; expected op | attention_core"},
      {"activation_checkpoint:\n  mode: full\n  selective_policy: attention_core\n",
       "activation_checkpoint.selective_policy: attention_core applies with activation_checkpoint.mode: selective"},
      {"plan_overrides:\n  - {match: '*.self_attn', module_type: Qwen3Attention, replace_module: fused_qkv_attention}\n"
       "activation_checkpoint:\n  mode: selective\n  selective_policy: attention_core\n",
       "policy attention_core recomputes the eager attention core; layer 0's attention is"},
      {"moe_capacity_factor: -1\n", "moe_capacity_factor: '-1' is not allowed; expected a number >= 0 (0: dropless)"},
      {"moe_capacity_factor: 1.0\n", "moe_capacity_factor applies to mixture-of-experts models, and qwen3 has no experts; remove it"},
      {"accelerator:\n  ep_size: 2\n", "accelerator.ep_size / fsdp_config.edp_shard_size: ep(2) does not divide dp_shard(1) x cp(1) x tp(1) = 1"},
      {"fsdp_config:\n  replicate_params: ['*nothing*']\n", "fsdp_config.replicate_params: '*nothing*' matches no parameter"},
      {"plan_overrides:\n  - {match: '*', module_type: Qwen3RMSNorm}\n", "plan_overrides[0] needs match, module_type and replace_module"},
      {"plan_overrides:\n  - {match: '*', module: Qwen3RMSNorm, replace_module: x}\n", "plan_overrides[0] has unknown key 'module'"},
      {"plan_overrides:\n  - {match: '*', module_type: Qwen3RMSNorm, replace_module: fast_norm}\n", "fast_norm"},
      {"resume_from_checkpoint: latest\n", "resume_from_checkpoint: latest, but output_dir"},
      {"dataset: my_data\nheldout_eval_samples: 4\n", "heldout_eval_samples: needs a built-in synthetic dataset"},
      {"report_to: slack\n", "report_to: 'slack' is not allowed; expected none | all | "},
      {"report_to: [wandb, slack]\n", "report_to: 'slack' is not allowed"},
      {"lr_scheduler_type: cosine_with_min_lr\n", "cosine_with_min_lr needs exactly one of lr_scheduler_kwargs.min_lr or lr_scheduler_kwargs.min_lr_rate"},
      {"lr_scheduler_kwargs: {min_lr_ratio: 0.1}\n", "lr_scheduler_kwargs has unknown entry 'min_lr_ratio' (did you mean 'min_lr_rate'?)"},
      {"lr_scheduler_kwargs: {power: -1}\n", "lr_scheduler_kwargs.power: '-1' is not allowed; expected a number > 0"},
      {"lr_scheduler_kwargs: 3\n", "lr_scheduler_kwargs: '3' is not allowed; expected a mapping"},
      {"lr_scheduler_type: polynomial\nlr_scheduler_kwargs: {lr_end: 1.0}\n", "polynomial decays learning_rate to lr_scheduler_kwargs.lr_end"},
      {"optim: sgd\n", "optim: 'sgd' is not allowed; expected adamw_torch | adamw_torch_fused | adamw_hf | adamw_apex_fused"},
      {"save_strategy: epoch\n", "save_strategy: 'epoch' is not allowed; expected steps | no"},
      {"mix_strategy: interleave_under\n", "mix_strategy: 'interleave_under' is not allowed; expected concat"},
      {"mask_history: true\ntrain_on_prompt: true\n", "mask_history and train_on_prompt contradict each other"},
      {"quantization_bit: 4\n", "quantization_bit is not supported: quantized training is not supported"},
      {"use_galore: true\n", "use_galore is not supported: only AdamW is implemented"},
      {"val_size: 2.5\n", "val_size: '2.5' is not allowed; expected 0, a fraction in (0, 1) or a whole count >= 1"},
      {"eval_strategy: steps\n", "eval_strategy: steps needs rows to evaluate"},
      {"eval_steps: 1.5\n", "eval_steps: '1.5' is not allowed; expected an integer >= 1 or a fraction in (0, 1)"},
      {"hyper_parallel_args: /nonexistent.json\n", "/nonexistent.json"},
      {"ddp_timeout: 0\n", "ddp_timeout: '0' is not allowed"},
      {"template: chatml\n", "template: 'chatml' is not allowed; expected default | llama2 | llama3 | qwen | qwen3 | qwen3_nothink"},
      {"dataset: synthetic_revers\n", "dataset 'synthetic_revers' is neither built in nor in"},
      {"model_name_or_path: qwen4-debug\n", "qwen4-debug"},
      {"tokenizer: /nonexistent\n", "tokenizer /nonexistent does not exist"},
      {"nproc_per_node: many\n", "nproc_per_node: 'many'"},
      {"comm_timeout_s: 0\n", "comm_timeout_s: '0'"},
      {"comm_timeout_s: 1e30\n", "comm_timeout_s: '1e30' is not allowed; expected a number of seconds in [1, 604800]"},
      {"comm_timeout_s: 1e-9\n", "comm_timeout_s: '1e-9' is not allowed; expected a number of seconds in [1, 604800]"},
      {"heartbeat_timeout_s: -5\n", "heartbeat_timeout_s: '-5' is not allowed; expected 0 (off) or a number of seconds in [1, 604800]"},
      {"heartbeat_timeout_s: 1e30\n", "heartbeat_timeout_s: '1e30' is not allowed"},
      {"ddp_timeout: 10000000000000\n", "ddp_timeout: '10000000000000' is not allowed; expected an integer <= 1099511627776"},
      {"nproc_per_node: 4294967297\n", "nproc_per_node: '4294967297' is not allowed; expected an integer <= 4096"},
      {"per_device_train_batch_size: 4611686018427387905\n", "per_device_train_batch_size: '4611686018427387905' is not allowed; expected an integer <= 1048576"},
      {"gradient_accumulation_steps: 2000000\n", "gradient_accumulation_steps: '2000000' is not allowed; expected an integer <= 1048576"},
      {"max_steps: 99999999999999999\n", "max_steps: '99999999999999999' is not allowed; expected an integer <= 1099511627776"},
      {"learning_rate: 1.0e-4\nlearning_rate: 2.0e-4\n", "key 'learning_rate' is given twice (lines "},
      {"fsdp_config:\n  dp_shard_size: 2\n  dp_shard_size: 1\n", "key 'fsdp_config.dp_shard_size' is given twice"},
      {"? " + std::string(300000, 'k') + "\n: 1\n", "unknown key '" + std::string(120, 'k') + "...' (300000 bytes); every key"},
      {"template: " + std::string(300000, 'q') + "\n", "template: '" + std::string(120, 'q') + "...' (300000 bytes) is not allowed"},
      {"key without a value\n", "unknown key 'key without a value'"},
      {"learning_rate: [1\n", "is not valid YAML"},
  };
  for (const auto& [bad, expected] : cases) {
    SCOPED_TRACE(bad);
    // The bad lines replace the valid value of the same key (a key given twice is an error).
    const std::string yaml = valid_without(bad.substr(0, bad.find(':'))) + out + bad;
    const auto run = hp::testing::run_subprocess({HP_CLI_PATH, "train", write_yaml("bad", yaml)});
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find(expected), std::string::npos) << run.output;
    EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;
  }
  EXPECT_GE(cases.size(), 50u);
  // Required keys and the command line itself.
  const auto missing = hp::testing::run_subprocess({HP_CLI_PATH, "train", write_yaml("missing", "dataset: synthetic_reverse\n")});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("model_name_or_path is required"), std::string::npos) << missing.output;
  const auto flag = hp::testing::run_subprocess({HP_CLI_PATH, "train", write_yaml("ok", kValid + out), "--fsdp_config=3"});
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_NE(flag.output.find("fsdp_config is a section"), std::string::npos) << flag.output;
  const auto list = hp::testing::run_subprocess({HP_CLI_PATH, "train", write_yaml("list", "- a\n- b\n")});
  EXPECT_EQ(list.exit_code, 2);
  EXPECT_NE(list.output.find("must be a mapping of keys to values"), std::string::npos) << list.output;
  const auto no_file = hp::testing::run_subprocess({HP_CLI_PATH, "train", "/nonexistent.yaml"});
  EXPECT_EQ(no_file.exit_code, 2);
  EXPECT_NE(no_file.output.find("cannot read the config file /nonexistent.yaml"), std::string::npos) << no_file.output;
}

// chunked_loss: auto chunks where a micro-batch's fp32 logits are large (Qwen3's vocabulary,
// LlamaFactory's 2 x 512 tokens), not the demo's; an explicit value wins; auto stays off where
// the chunked loss cannot run.
TEST(TrainConfig, ChunkedLossAutoChunksWhereTheLogitsAreLarge) {
  const std::string path = write_yaml("chunked_auto", kValid);
  hp::models::ModelConfig qwen3 = hp::models::debug_flavour_config("qwen3-debug");
  qwen3.vocab_size = 151936;
  const std::string out = "output_dir=" + ::testing::TempDir() + "hp_chunked_auto";
  const auto at = [&](std::vector<std::string> overrides, int64_t cp = 1) {
    overrides.push_back(out);
    return hp::train::resolve_loss_chunking(hp::train::load_train_config(path, overrides), qwen3, cp);
  };
  const auto real = at({"per_device_train_batch_size=2", "cutoff_len=512"});
  EXPECT_EQ(real.chunk_tokens, 256);  // 128 MiB / (151936 x 4 bytes) = 220, rounded up to a multiple of 128
  EXPECT_NE(real.reason.find("auto: a micro-batch's fp32 logits up to 593 MiB (1024 tokens x 151936"), std::string::npos) << real.reason;
  EXPECT_EQ(at({"per_device_train_batch_size=2", "cutoff_len=128"}).chunk_tokens, 0);  // 148 MiB
  hp::models::ModelConfig llama3 = qwen3;  // 128,256 tokens: 261 rounded up to 384; 32,000: 1048 up to 1152
  llama3.vocab_size = 128256;
  EXPECT_EQ(hp::train::resolve_loss_chunking(hp::train::load_train_config(path, {"per_device_train_batch_size=4", "cutoff_len=1024", out}),
                                             llama3, 1).chunk_tokens, 384);
  llama3.vocab_size = 32000;
  EXPECT_EQ(hp::train::resolve_loss_chunking(hp::train::load_train_config(path, {"per_device_train_batch_size=4", "cutoff_len=2048", out}),
                                             llama3, 1).chunk_tokens, 1152);
  EXPECT_EQ(at({"per_device_train_batch_size=2", "cutoff_len=512", "chunked_loss.chunk_size=300"}).chunk_tokens, 300);
  EXPECT_EQ(at({"per_device_train_batch_size=2", "cutoff_len=512", "chunked_loss.enabled=false"}).chunk_tokens, 0);
  EXPECT_EQ(at({"per_device_train_batch_size=1", "cutoff_len=64", "chunked_loss.enabled=true"}).chunk_tokens, 256);
  const auto sharded = at({"per_device_train_batch_size=2", "cutoff_len=512", "accelerator.tp_size=2",
                           "accelerator.sequence_parallel=true", "accelerator.loss_parallel=true"});
  EXPECT_EQ(sharded.chunk_tokens, 0);
  EXPECT_NE(sharded.reason.find("sequence-sharded"), std::string::npos) << sharded.reason;
  // Context parallelism: each rank holds 1/cp of the row's tokens.
  EXPECT_EQ(at({"per_device_train_batch_size=2", "cutoff_len=512"}, 4).chunk_tokens, 0);
  // The demo: 8 x 96 tokens of a 512-token vocabulary.
  EXPECT_EQ(hp::train::resolve_loss_chunking(hp::train::load_train_config(HP_SOURCE_DIR "/examples/demo_sft.yaml", {}),
                                             hp::models::debug_flavour_config("qwen3-debug"), 1).chunk_tokens, 0);
  const std::string bad = hp::testing::user_error_of([&] { hp::train::load_train_config(path, {"chunked_loss.enabled=maybe", out}); });
  EXPECT_NE(bad.find("expected true, false or auto"), std::string::npos) << bad;
}
