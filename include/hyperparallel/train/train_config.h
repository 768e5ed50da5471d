// TrainConfig: everything `hyperparallel train` reads, from YAML and the command line.
//
// Precedence: command line (--key=value, --section.key=value) over the YAML file over the
// defaults. Keys are LlamaFactory's SFT keys plus the sections fsdp_config (with
// mix_precision), accelerator, model and plan_overrides; config_schema() lists every key with
// its type, default and meaning, and docs/config.md documents each (a test keeps the three in
// step). Every mistake is a UserError of one line naming the key: an unknown key (with "did you
// mean"), a value of the wrong type or out of range (with what is allowed), a combination that
// cannot work. A YAML null (`key:` or `key: ~`) means the default.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hyperparallel/data/dataset_registry.h"
#include "hyperparallel/models/plan_overrides.h"

namespace hyperparallel::train {

struct MixPrecisionConfig {
  std::string param_dtype = "float32";   // float32 | bfloat16
  std::string reduce_dtype = "float32";  // float32 | bfloat16
  std::string output_dtype = "float32";  // float32 | bfloat16
};

// lr_scheduler_kwargs, as HF's get_scheduler reads them for each schedule.
struct LrSchedulerKwargs {
  std::optional<double> min_lr;       // cosine_with_min_lr: floor of the rate
  std::optional<double> min_lr_rate;  // cosine_with_min_lr: floor as a fraction of learning_rate
  double num_cycles = -1;             // cosine (0.5) and cosine_with_restarts (1); -1: the schedule's default
  double lr_end = 1e-7;               // polynomial: final rate
  double power = 1.0;                 // polynomial: exponent
};

struct FsdpConfig {
  int64_t dp_shard_size = -1;  // -1: world size / replicas (plain FSDP over every rank)
  int64_t edp_shard_size = -1;
  int64_t reshard_after_forward = 1;  // 1 = true, 0 = false, k > 1 = keep sharded over k ranks
  bool reshard_after_backward = true;
  int64_t forward_prefetch_depth = 1;
  int64_t backward_prefetch_depth = 1;
  int64_t layers_per_unit = 1;  // decoder layers sharded as one FSDP unit
  bool comm_fusion = true;
  MixPrecisionConfig mix_precision;
  bool enable_offload = false;
  std::vector<std::string> replicate_params;  // glob patterns on parameter names
};

struct AcceleratorConfig {
  int64_t tp_size = 1, cp_size = 1, ep_size = 1, pp_size = 1;
  bool sequence_parallel = false;
  bool loss_parallel = false;
  std::string cp_algorithm = "ring";  // ulysses | allgather | ring | hybrid (cp/context_parallel.h)
  int64_t ulysses_degree = 0;          // 0: the algorithm's own
  // Pipeline parallelism (pp/): micro-batches per step (unset: gradient_accumulation_steps),
  // schedule, stages per rank, explicit layer ranges per stage (empty: balanced).
  std::optional<int64_t> pp_microbatches;
  std::string pp_schedule = "1f1b";
  int64_t pp_virtual_stages = 1;
  std::vector<std::string> pp_layers;
};

// Activation checkpointing (models/activation_checkpoint.h).
struct ActivationCheckpointConfig {
  std::string mode = "off";  // off | full | selective
  int64_t every = 1;         // decoder layers 0, every, 2·every, ... are checkpointed
  bool swap_inputs = false;  // full: the kept inputs wait in a host pool (models/activation_checkpoint.h)
  std::string selective_policy = "op";  // selective: op (Linear outputs kept) | attention_core
};

// Chunked loss (CausalLM::set_loss_chunk_tokens); train/loss_chunking.h decides "auto".
struct ChunkedLossConfig {
  std::optional<bool> enabled;            // unset: auto, on where a micro-batch's logits are large
  std::optional<int64_t> chunk_size;      // tokens per chunk; unset: about 64 MiB of fp32 logits
};

// optim: muon (optim/muon.h): Muon for the matrices, AdamW for the rest. Unset lr and
// weight_decay follow learning_rate and weight_decay (with adjust_lr match_rms_adamw one
// schedule suits both).
struct MuonConfig {
  std::optional<double> lr, weight_decay;
  double momentum = 0.95;
  bool nesterov = true;
  int64_t ns_steps = 5;
  std::string adjust_lr = "match_rms_adamw";  // or original
  bool set = false;  // some muon_config key was given
};

struct TrainConfig {
  // model
  std::string model_name_or_path;  // HF folder or a built-in debug flavour
  std::string tokenizer;           // folder with tokenizer.json; "" = model_name_or_path
  std::vector<models::PlanOverride> plan_overrides;
  bool validate_placement = false;  // model.validate_placement: tp/placement_checks.h
  std::optional<int64_t> num_hidden_layers;  // model.num_hidden_layers: keep the first N layers
  // method
  std::string stage = "sft";
  bool do_train = true;
  std::string finetuning_type = "full";
  bool use_hyper_parallel = true;
  // data
  std::string dataset;
  std::string dataset_dir = "data";
  data::DatasetFile dataset_file;  // dataset_file.*: one dataset by its path (HyperParallel's dataset.data_path)
  std::string chat_template;  // key "template"
  int64_t cutoff_len = 2048;
  std::optional<int64_t> max_samples;
  bool packing = false;
  bool train_on_prompt = false;
  bool mask_history = false;                  // labels on the last assistant turn only
  std::optional<std::string> default_system;  // null: the template's own default system prompt
  std::optional<std::string> tool_format;     // null: the template's own (data/tool_calls.h)
  bool enable_thinking = true;
  std::string bad_records = "stop";  // stop | skip
  std::string tokenized_path;        // LlamaFactory's: read tokenized rows from there, or save them there
  std::string tokenized_cache_dir;   // "": $XDG_CACHE_HOME/hyperparallel/tokenized; "none": no cache
  bool overwrite_cache = false;      // tokenize again, replacing the cached rows
  std::optional<int64_t> preprocessing_num_workers;  // tokenizing threads; null: every usable core
  int64_t heldout_eval_samples = 0;
  // evaluation loss (train/eval_loss.h)
  bool do_eval = false;                 // evaluate after the last step (set by eval_strategy too)
  std::string eval_dataset;             // names, like dataset
  double val_size = 0;                  // rows split off the training data: a fraction < 1, else a count
  std::string eval_strategy = "no";     // no | steps | epoch
  double eval_steps = 0;                // 0: logging_steps; < 1: a fraction of the run
  int64_t per_device_eval_batch_size = 8;
  bool eval_on_start = false;  // built-in synthetic datasets: accuracy before/after
  // output
  std::string output_dir;
  bool overwrite_output_dir = false;
  int64_t logging_steps = 10;
  int64_t save_steps = 500;
  bool save_checkpoints = true;  // save_strategy: no turns checkpoints off (the model is still exported)
  std::optional<int64_t> save_total_limit;
  bool plot_loss = false;
  int64_t trace_steps = 0;  // a Chrome trace of the last N steps in output_dir/trace.json (step_trace.h)
  // training
  int64_t per_device_train_batch_size = 1;
  int64_t gradient_accumulation_steps = 1;
  // Rows per optimizer step; set: gradient_accumulation_steps = it / (per_device_train_batch_size
  // x data-parallel ranks), resolved when the world is known (trainer).
  std::optional<int64_t> global_batch_size;
  double learning_rate = 5e-5;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;
  double num_train_epochs = 3.0;
  int64_t max_steps = -1;
  std::string lr_scheduler_type = "linear";  // linear | cosine | cosine_with_min_lr | polynomial | ...
  LrSchedulerKwargs lr_scheduler_kwargs;
  double warmup_ratio = 0.0;
  int64_t warmup_steps = 0;
  bool bf16 = false;
  bool bf16_auto = false;  // bf16: auto, resolved by the trainer from every rank's CPU
  bool fp16 = false;  // refused with the reason: bf16 is the half-precision mode here
  std::string moe_aux_loss_scope = "global";  // global | micro_batch (train_step.h)
  double moe_capacity_factor = 0;             // 0: dropless (ep::set_expert_capacity)
  int64_t seed = 42;
  std::string resume_from_checkpoint;  // "" | PATH | latest
  // processes
  int64_t nproc_per_node = 1;
  double comm_timeout_s = 300;
  double heartbeat_timeout_s = 30;  // 0 = no watchdog
  // LlamaFactory keys accepted for compatibility (ddp_timeout sets comm_timeout_s).
  std::vector<std::string> report_to;  // trackers asked for: tensorboard is written, the others listed as ignored
  std::string logging_dir;             // TensorBoard files; "": output_dir/runs/<date>_<host>
  bool trust_remote_code = false;
  std::string optim = "adamw_torch";
  std::string deepspeed;  // a DeepSpeed config path: not read, FSDP does the sharding (listed as ignored)
  std::string hyper_parallel_args;  // HyperParallelArguments JSON, applied as our keys at load
  // Keys of LlamaFactory / the HF Trainer accepted with no effect here, with the reason; the
  // trainer lists them once when it starts.
  std::vector<std::pair<std::string, std::string>> ignored_keys;
  FsdpConfig fsdp_config;
  AcceleratorConfig accelerator;
  ActivationCheckpointConfig activation_checkpoint;
  ChunkedLossConfig chunked_loss;
  MuonConfig muon_config;
  std::string optimizer_offload_dir;  // optimizer_offload.dir: AdamW moments in a file there ("" = in memory)
  // LlamaFactory / HF spellings of activation checkpointing: gradient_checkpointing: true
  // means activation_checkpoint.mode: full; disable_gradient_checkpointing: true means off.
  bool gradient_checkpointing = false, disable_gradient_checkpointing = false;
};

struct ConfigKeyInfo {
  std::string key;           // "fsdp_config.dp_shard_size"
  std::string type;          // "int >= -1, not 0", "cosine | linear | ..."
  std::string default_text;  // as YAML would write it; "(required)" where there is none
  std::string doc;           // one line
};

// Every key, in documentation order.
const std::vector<ConfigKeyInfo>& config_schema();
// The schema as text, one "key: type = default" line per key (frozen by a test).
std::string config_schema_text();

// Reads `yaml_path` ("" = none) and applies the overrides ("--key=value", "--key value" is
// split by the caller into "key=value"). UserError on any mistake.
TrainConfig load_train_config(const std::string& yaml_path, const std::vector<std::string>& overrides = {});

}  // namespace hyperparallel::train
