// The configuration keys: each one's name, type, default, meaning and setter. See
// train_config_keys.h.
#include "train_config_keys.h"

#include <yaml-cpp/yaml.h>

#include <cmath>

#include "hyperparallel/platform/suggest.h"
#include "hyperparallel/platform/user_error.h"
#include "config_values.h"

namespace hyperparallel::train {
namespace {

Setter int_at_least(int64_t TrainConfig::*field, int64_t min, int64_t max = kMaxCount) {
  return [=](TrainConfig& c, const std::string& k, const Value& v) {
    c.*field = as_int(k, v, min, "an integer >= " + std::to_string(min), max);
  };
}
Setter timeout_seconds(double TrainConfig::*field, bool zero_is_off) {
  return [=](TrainConfig& c, const std::string& k, const Value& v) {
    const std::string allowed = std::string(zero_is_off ? "0 (off) or " : "") + "a number of seconds in [1, 604800]";
    const double s = as_float(k, v, 0, kMaxTimeoutSeconds, false, false, allowed);
    if (s < 1 && !(zero_is_off && s == 0)) bad_value(k, v, allowed);
    c.*field = s;
  };
}
// -1 (automatic) or a positive integer; `field` picks the member, also inside a section.
Setter minus_one_or_positive(std::function<int64_t&(TrainConfig&)> field) {
  return [=](TrainConfig& c, const std::string& k, const Value& v) {
    const int64_t n = as_int(k, v, -1, "-1 or an integer >= 1");
    if (n == 0) bad_value(k, v, "-1 or an integer >= 1");
    field(c) = n;
  };
}
Setter boolean(bool TrainConfig::*field) {
  return [=](TrainConfig& c, const std::string& k, const Value& v) { c.*field = as_bool(k, v); };
}
Setter text(std::string TrainConfig::*field) {
  return [=](TrainConfig& c, const std::string& k, const Value& v) { c.*field = as_string(k, v); };
}
Setter choice(std::string TrainConfig::*field, std::vector<std::string> choices) {
  return [=](TrainConfig& c, const std::string& k, const Value& v) { c.*field = as_choice(k, v, choices); };
}
Setter positive_float(double TrainConfig::*field) {
  return [=](TrainConfig& c, const std::string& k, const Value& v) {
    c.*field = as_float(k, v, 0, INFINITY, true, false, "a number > 0");
  };
}
Setter fraction(double TrainConfig::*field, bool allow_one) {
  return [=](TrainConfig& c, const std::string& k, const Value& v) {
    c.*field = as_float(k, v, 0, 1, false, !allow_one, allow_one ? "a number in [0, 1]" : "a number in [0, 1)");
  };
}
Setter dtype(std::string MixPrecisionConfig::*field) {
  return [=](TrainConfig& c, const std::string& k, const Value& v) {
    c.fsdp_config.mix_precision.*field = as_choice(k, v, {"float32", "bfloat16"});
  };
}
Setter parallel_degree(int64_t AcceleratorConfig::*field) {
  return [=](TrainConfig& c, const std::string& k, const Value& v) { c.accelerator.*field = as_int(k, v, 1, "an integer >= 1"); };
}

void set_bf16(TrainConfig& c, const std::string& k, const Value& v) {
  c.bf16_auto = v.node.IsScalar() && v.node.Scalar() == "auto";
  bool on = false;
  if (!c.bf16_auto && (!v.node.IsScalar() || !YAML::convert<bool>::decode(v.node, on))) bad_value(k, v, "true, false or auto");
  c.bf16 = on;
}

void set_plan_overrides(TrainConfig& c, const std::string& k, const Value& v) {
  if (!v.node.IsSequence()) bad_value(k, v, "a list of {match, module_type, replace_module}");
  c.plan_overrides.clear();
  for (size_t i = 0; i < v.node.size(); ++i) {
    const YAML::Node& e = v.node[i];
    const std::string where = k + "[" + std::to_string(i) + "]";
    if (!e.IsMap()) throw UserError(v.source + ": " + where + " must be a mapping {match, module_type, replace_module}");
    models::PlanOverride o;
    for (const auto& item : e) {
      const std::string name = item.first.Scalar();
      if (!item.second.IsScalar()) throw UserError(v.source + ": " + where + "." + name + " must be a string");
      if (name == "match") {
        o.match = item.second.Scalar();
      } else if (name == "module_type") {
        o.module_type = item.second.Scalar();
      } else if (name == "replace_module") {
        o.replace_module = item.second.Scalar();
      } else {
        throw UserError(v.source + ": " + where + " has unknown key " + excerpt(name) +
                        did_you_mean(name, {"match", "module_type", "replace_module"}) + "; keys: match, module_type, replace_module");
      }
    }
    if (o.match.empty() || o.module_type.empty() || o.replace_module.empty()) {
      throw UserError(v.source + ": " + where + " needs match, module_type and replace_module");
    }
    c.plan_overrides.push_back(o);
  }
}

void set_lr_scheduler_kwargs(TrainConfig& c, const std::string& k, const Value& v) {
  const YAML::Node map = as_mapping(k, v);
  LrSchedulerKwargs out;
  for (const auto& item : map) {
    const std::string name = item.first.Scalar();
    const Value entry{item.second, v.source};
    const std::string where = k + "." + name;
    if (name == "min_lr") {
      out.min_lr = as_float(where, entry, 0, INFINITY, false, false, "a number >= 0");
    } else if (name == "min_lr_rate") {
      out.min_lr_rate = as_float(where, entry, 0, 1, false, false, "a number in [0, 1]");
    } else if (name == "num_cycles") {
      out.num_cycles = as_float(where, entry, 0, 1e6, true, false, "a number > 0");
    } else if (name == "lr_end") {
      out.lr_end = as_float(where, entry, 0, INFINITY, false, false, "a number >= 0");
    } else if (name == "power") {
      out.power = as_float(where, entry, 0, 1e3, true, false, "a number > 0");
    } else {
      throw UserError(v.source + ": " + k + " has unknown entry " + excerpt(name) +
                      did_you_mean(name, {"min_lr", "min_lr_rate", "num_cycles", "lr_end", "power"}) +
                      "; entries: min_lr, min_lr_rate (cosine_with_min_lr), num_cycles (cosine, cosine_with_restarts), "
                      "lr_end, power (polynomial)");
    }
  }
  c.lr_scheduler_kwargs = out;
}

// HF's report_to names; none of them is contacted here.
void set_report_to(TrainConfig& c, const std::string& k, const Value& v) {
  static const std::vector<std::string> kTrackers = {"none", "all", "azure_ml", "clearml", "codecarbon", "comet_ml", "dagshub",
                                                     "dvclive", "flyte", "mlflow", "neptune", "swanlab", "tensorboard",
                                                     "trackio", "wandb"};
  std::vector<std::string> names;
  if (v.node.IsSequence()) {
    for (const auto& e : v.node) names.push_back(as_choice(k, {e, v.source}, kTrackers));
  } else {
    names.push_back(as_choice(k, v, kTrackers));
  }
  c.report_to.clear();
  for (const auto& n : names) {
    if (n != "none") c.report_to.push_back(n);
  }
}

}  // namespace

const std::vector<KeyDef>& key_table() {
  static const std::vector<KeyDef> table = [] {
    using C = TrainConfig;
    std::vector<KeyDef> t = {
        // model
        {{"model_name_or_path", "string", "(required)", "Hugging Face model folder, or a built-in debug flavour (qwen3-debug, ...)"}, text(&C::model_name_or_path)},
        {{"tokenizer", "string", "\"\"", "folder with tokenizer.json (+ tokenizer_config.json); empty: model_name_or_path"}, text(&C::tokenizer)},
        {{"plan_overrides", "list of {match, module_type, replace_module}", "[]", "module replacements applied when the model is built"}, set_plan_overrides},
        {{"model.validate_placement", "bool", "false", "Validation mode: the tensor-parallel plan runs with every module boundary's placement measured and checked (same numbers, slower); a plan error names the module, op and placements"}, boolean(&C::validate_placement)},
        {{"model.num_hidden_layers", "int >= 1 or null", "null", "keep only the model's first N decoder layers (HyperParallel's key: a layer-cropped model from a full folder; the later layers are not loaded)"}, [](C& c, const std::string& k, const Value& v) { c.num_hidden_layers = as_int(k, v, 1, "an integer >= 1"); }},
        // method
        {{"stage", "sft | pt", "sft", "sft: chat data with a template; pt: continued pretraining on plain text, every token trained, packing on unless set false, template optional (docs/data.md)"}, choice(&C::stage, {"sft", "pt"})},
        {{"do_train", "bool", "true", "train (false: only load, evaluate and export)"}, boolean(&C::do_train)},
        {{"finetuning_type", "full | lora | freeze", "full", "full fine-tuning; lora and freeze are not supported yet"}, choice(&C::finetuning_type, {"full", "lora", "freeze"})},
        {{"use_hyper_parallel", "bool", "true", "LlamaFactory's switch to this backend; must be true here"}, boolean(&C::use_hyper_parallel)},
        // data
        {{"dataset", "string", "(required)", "comma-separated names from dataset_dir/dataset_info.json or built-in synthetic datasets"}, text(&C::dataset)},
        {{"dataset_dir", "string", "data", "folder with dataset_info.json"}, text(&C::dataset_dir)},
        {{"dataset_file.path", "string", "\"\"", "a .json / .jsonl dataset file (or a folder of them; stage pt also .txt) by its path from the working directory, read after the named datasets (HyperParallel's dataset.data_path)"}, [](C& c, const std::string& k, const Value& v) { c.dataset_file.path = as_string(k, v); }},
        {{"dataset_file.formatting", "auto | alpaca | sharegpt | openai", "auto", "how its records read: auto takes a record with the turns column as sharegpt, any other as alpaca (stage pt: its text column)"}, [](C& c, const std::string& k, const Value& v) { c.dataset_file.formatting = as_choice(k, v, {"auto", "alpaca", "sharegpt", "openai"}); }},
        {{"dataset_file.column", "string", "\"\"", "the column of a record's turns (sharegpt / openai; \"\": conversations or messages, whichever a record has) or, stage pt, of its text (\"\": text)"}, [](C& c, const std::string& k, const Value& v) { c.dataset_file.column = as_string(k, v); }},
        {{"dataset_file.role_tag", "string", "\"\"", "a turn's role field; \"\": from (conversations) or role (messages); role names are human|user, gpt|assistant, system, observation|tool, function_call"}, [](C& c, const std::string& k, const Value& v) { c.dataset_file.role_tag = as_string(k, v); }},
        {{"dataset_file.content_tag", "string", "\"\"", "a turn's content field; \"\": value (conversations) or content (messages)"}, [](C& c, const std::string& k, const Value& v) { c.dataset_file.content_tag = as_string(k, v); }},
        {{"dataset_file.text_template", "string", "\"\"", "stage pt: each record rendered as this template instead, {field} for its field, {{ and }} for braces (Python's str.format_map)"}, [](C& c, const std::string& k, const Value& v) { c.dataset_file.text_template = as_string(k, v); }},
        {{"template", "default | llama2 | llama3 | qwen | qwen3 | qwen3_nothink", "(required for sft)", "chat template that renders the conversations (docs/data.md); stage pt: picks the eos token only"}, choice(&C::chat_template, {"default", "llama2", "llama3", "qwen", "qwen3", "qwen3_nothink"})},
        {{"cutoff_len", "int in [2, 16777216]", "2048", "tokens per sample (and per packed row); longer samples are cut"}, int_at_least(&C::cutoff_len, 2, 1 << 24)},
        {{"max_samples", "int >= 1", "null", "first N samples of each dataset; null: all"}, [](C& c, const std::string& k, const Value& v) { c.max_samples = as_int(k, v, 1, "an integer >= 1"); }},
        {{"packing", "bool", "false", "concatenate samples into rows of cutoff_len, positions restarting per sample"}, boolean(&C::packing)},
        {{"neat_packing", "bool", "false", "LlamaFactory's packing without attention across samples, which is what packing does here: true sets packing"}, [](C& c, const std::string& k, const Value& v) { c.packing = as_bool(k, v) || c.packing; }},
        {{"train_on_prompt", "bool", "false", "take the loss on prompt tokens too"}, boolean(&C::train_on_prompt)},
        {{"mask_history", "bool", "false", "take the loss on the last assistant response of each conversation only"}, boolean(&C::mask_history)},
        {{"default_system", "string", "null", "system prompt for conversations without one; null: the template's own (qwen: \"You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\", as LlamaFactory), \"\": none"}, [](C& c, const std::string& k, const Value& v) { c.default_system = as_string(k, v); }},
        {{"mix_strategy", "concat", "concat", "several datasets are concatenated in the order named (LlamaFactory's interleave_under / interleave_over are not supported)"}, [](C&, const std::string& k, const Value& v) { as_choice(k, v, {"concat"}); }},
        {{"tool_format", "default | llama3 | qwen", "null", "how tool descriptions and function calls are written, as LlamaFactory's tool format of that name (docs/data.md \"Tool calls\"); null: the template's own (qwen, qwen3, qwen3_nothink: qwen; llama3: llama3; default: default); when set, function calls end with the eos token alone, as in LlamaFactory"}, [](C& c, const std::string& k, const Value& v) { c.tool_format = as_choice(k, v, {"default", "llama3", "qwen"}); }},
        {{"enable_thinking", "bool", "true", "qwen3 template: false adds the empty think block to generation prompts"}, boolean(&C::enable_thinking)},
        {{"bad_records", "stop | skip", "stop", "a malformed dataset record stops the run, or is skipped and reported"}, choice(&C::bad_records, {"stop", "skip"})},
        {{"tokenized_path", "string", "null", "LlamaFactory's: a folder of tokenized rows. Holding them (train.hprows), they are read and the dataset keys ignored; else the data is tokenized and saved there. A folder saved by LlamaFactory (Arrow) is refused: it cannot be read here"}, text(&C::tokenized_path)},
        {{"tokenized_cache_dir", "string", "\"\"", "where tokenized rows are cached, keyed by data, tokenizer, template and cutoff (docs/data.md \"Tokenizing once\"); \"\": $XDG_CACHE_HOME/hyperparallel/tokenized (~/.cache/...); none: no cache, each rank tokenizes"}, text(&C::tokenized_cache_dir)},
        {{"overwrite_cache", "bool", "false", "tokenize again and replace the cached rows (tokenized_cache_dir)"}, boolean(&C::overwrite_cache)},
        {{"preprocessing_num_workers", "int >= 1", "null", "threads that tokenize; null: every core this process may use"}, [](C& c, const std::string& k, const Value& v) { c.preprocessing_num_workers = as_int(k, v, 1, "an integer >= 1"); }},
        {{"heldout_eval_samples", "int >= 0", "0", "built-in synthetic datasets: answer N held-out prompts before and after training, report accuracy"}, int_at_least(&C::heldout_eval_samples, 0)},
        // evaluation
        {{"do_eval", "bool", "false", "evaluate the loss on the eval rows after the last step (eval_strategy steps or epoch sets it)"}, boolean(&C::do_eval)},
        {{"eval_dataset", "string", "\"\"", "comma-separated dataset names for evaluation, read like dataset"}, text(&C::eval_dataset)},
        {{"val_size", "float >= 0", "0", "rows split off the training data for evaluation by a seeded shuffle: a fraction below 1, else a count"}, [](C& c, const std::string& k, const Value& v) {
           c.val_size = as_float(k, v, 0, 1e12, false, false, "0, a fraction in (0, 1) or a whole count >= 1");
           if (c.val_size >= 1 && c.val_size != std::floor(c.val_size)) bad_value(k, v, "0, a fraction in (0, 1) or a whole count >= 1");
         }},
        {{"eval_strategy", "no | steps | epoch", "no", "when to evaluate during training: every eval_steps, or at the end of each epoch"}, choice(&C::eval_strategy, {"no", "steps", "epoch"})},
        {{"evaluation_strategy", "no | steps | epoch", "no", "the older HF name of eval_strategy"}, choice(&C::eval_strategy, {"no", "steps", "epoch"})},
        {{"eval_steps", "float > 0", "null", "evaluate every N steps (below 1: that fraction of the run); null: logging_steps"}, [](C& c, const std::string& k, const Value& v) {
           c.eval_steps = as_float(k, v, 0, static_cast<double>(kMaxCount), true, false, "an integer >= 1 or a fraction in (0, 1)");
           if (c.eval_steps > 1 && c.eval_steps != std::floor(c.eval_steps)) bad_value(k, v, "an integer >= 1 or a fraction in (0, 1)");
         }},
        {{"per_device_eval_batch_size", "int in [1, 1048576]", "8", "eval rows per rank per forward"}, int_at_least(&C::per_device_eval_batch_size, 1, 1 << 20)},
        {{"eval_on_start", "bool", "false", "also evaluate before the first step (a baseline)"}, boolean(&C::eval_on_start)},
        // output
        {{"output_dir", "string", "(required)", "where logs, checkpoints and the exported model go"}, text(&C::output_dir)},
        {{"overwrite_output_dir", "bool", "false", "allow an output_dir that already holds results"}, boolean(&C::overwrite_output_dir)},
        {{"logging_steps", "int >= 1", "10", "write a trainer_log.jsonl line every N steps"}, int_at_least(&C::logging_steps, 1)},
        {{"save_steps", "int >= 0", "500", "checkpoint every N steps; 0: only at the end"}, int_at_least(&C::save_steps, 0)},
        {{"save_strategy", "steps | no", "steps", "steps: a checkpoint every save_steps; no: no checkpoints (the model is still exported at the end)"}, [](C& c, const std::string& k, const Value& v) { c.save_checkpoints = as_choice(k, v, {"steps", "no"}) == "steps"; }},
        {{"logging_strategy", "steps", "steps", "a trainer_log.jsonl line every logging_steps (HF's epoch / no are not supported)"}, [](C&, const std::string& k, const Value& v) { as_choice(k, v, {"steps"}); }},
        {{"save_total_limit", "int >= 1", "null", "keep at most N checkpoints (oldest removed); null: all"}, [](C& c, const std::string& k, const Value& v) { c.save_total_limit = as_int(k, v, 1, "an integer >= 1"); }},
        {{"plot_loss", "bool", "false", "write training_loss.svg"}, boolean(&C::plot_loss)},
        {{"trace_steps", "int >= 0", "0", "write trace.json: a Chrome trace of the last N steps on every rank (units' compute, collectives, waits)"}, int_at_least(&C::trace_steps, 0)},
        // training
        {{"per_device_train_batch_size", "int in [1, 1048576]", "1", "rows per rank per micro-batch"}, int_at_least(&C::per_device_train_batch_size, 1, 1 << 20)},
        {{"gradient_accumulation_steps", "int in [1, 1048576]", "1", "micro-batches per optimizer step"}, int_at_least(&C::gradient_accumulation_steps, 1, 1 << 20)},
        {{"global_batch_size", "int >= 1 or null", "null", "rows per optimizer step (HyperParallel's key); set: gradient_accumulation_steps = it / (per_device_train_batch_size x data-parallel ranks), which must divide it"}, [](C& c, const std::string& k, const Value& v) { c.global_batch_size = as_int(k, v, 1, "an integer >= 1"); }},
        {{"learning_rate", "float > 0", "5.0e-5", "peak learning rate of AdamW"}, positive_float(&C::learning_rate)},
        {{"weight_decay", "float >= 0", "0.0", "AdamW's decoupled weight decay"}, [](C& c, const std::string& k, const Value& v) { c.weight_decay = as_float(k, v, 0, INFINITY, false, false, "a number >= 0"); }},
        {{"adam_beta1", "float in [0, 1)", "0.9", "AdamW beta1"}, fraction(&C::adam_beta1, false)},
        {{"adam_beta2", "float in [0, 1)", "0.999", "AdamW beta2"}, fraction(&C::adam_beta2, false)},
        {{"adam_epsilon", "float > 0", "1.0e-8", "AdamW epsilon"}, positive_float(&C::adam_epsilon)},
        {{"max_grad_norm", "float >= 0", "1.0", "clip the global gradient norm (over all shards) to this; 0: no clipping"}, [](C& c, const std::string& k, const Value& v) { c.max_grad_norm = as_float(k, v, 0, INFINITY, false, false, "a number >= 0"); }},
        {{"num_train_epochs", "float > 0", "3.0", "passes over the data (when max_steps is -1)"}, positive_float(&C::num_train_epochs)},
        {{"max_steps", "int, -1 or >= 1", "-1", "optimizer steps; -1: from num_train_epochs"}, minus_one_or_positive([](C& c) -> int64_t& { return c.max_steps; })},
        {{"lr_scheduler_type", "linear | cosine | cosine_with_min_lr | cosine_with_restarts | polynomial | constant | constant_with_warmup", "linear", "learning-rate schedule after warmup, as HF's get_scheduler (docs/training.md)"}, choice(&C::lr_scheduler_type, {"linear", "cosine", "cosine_with_min_lr", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"})},
        {{"lr_scheduler_kwargs", "mapping", "{}", "schedule arguments: min_lr or min_lr_rate (cosine_with_min_lr), num_cycles (cosine, cosine_with_restarts), lr_end and power (polynomial)"}, set_lr_scheduler_kwargs},
        {{"optim", "adamw_torch | adamw_torch_fused | adamw_hf | adamw_apex_fused | muon", "adamw_torch", "the optimizer: AdamW with decoupled weight decay under every name HF gives it, or muon (Muon for the 2-D weights, orthogonalised whole on an owner rank under any sharding; AdamW for embeddings, head, norms and biases; muon_config.*, docs/optimizers.md)"}, choice(&C::optim, {"adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_apex_fused", "muon"})},
        {{"warmup_ratio", "float in [0, 1)", "0.0", "warmup steps as a fraction of all steps (when warmup_steps is 0)"}, fraction(&C::warmup_ratio, false)},
        {{"warmup_steps", "int >= 0", "0", "linear warmup steps; overrides warmup_ratio when > 0"}, int_at_least(&C::warmup_steps, 0)},
        {{"bf16", "bool | auto", "false", "compute in bfloat16 (parameters all-gathered in bf16, fp32 masters and reductions); auto: bf16 where every rank's CPU has AVX512_BF16 or AMX-BF16, else fp32 (the log says which)"}, set_bf16},
        {{"fp16", "bool", "false", "float16 compute is not supported (no fast fp16 kernels on CPU, and fp16 needs loss scaling); use bf16"}, boolean(&C::fp16)},
        {{"moe_aux_loss_scope", "global | micro_batch", "global", "MoE load-balancing loss over the tokens of all ranks' micro-batch (global: every data-parallel split gives the same step) or per rank and micro-batch as HF computes it in one forward (micro_batch)"}, choice(&C::moe_aux_loss_scope, {"global", "micro_batch"})},
        {{"moe_capacity_factor", "float >= 0", "0", "MoE expert capacity: each expert takes at most ceil(factor x tokens x k / experts) of a forward's routed pairs (first choices first) and drops the rest, logged as moe_dropped_fraction; decided per micro-batch, so layouts agree only at the same micro-batches; 0: dropless, as HF (docs/ep.md)"}, [](C& c, const std::string& k, const Value& v) { c.moe_capacity_factor = as_float(k, v, 0, INFINITY, false, true, "a number >= 0 (0: dropless)"); }},
        {{"seed", "int >= 0", "42", "model initialisation (debug flavours) and data order"}, int_at_least(&C::seed, 0)},
        {{"resume_from_checkpoint", "string", "\"\"", "a checkpoint folder, or latest (the newest complete one in output_dir)"}, text(&C::resume_from_checkpoint)},
        // processes
        {{"nproc_per_node", "int in [1, 4096]", "1", "local ranks that `hyperparallel train` starts (ignored under a launcher)"}, int_at_least(&C::nproc_per_node, 1, 4096)},
        {{"comm_timeout_s", "float in [1, 604800]", "300", "a collective that waits longer fails the run"}, timeout_seconds(&C::comm_timeout_s, false)},
        {{"heartbeat_timeout_s", "float, 0 or in [1, 604800]", "30", "a rank whose heartbeat stops this long (or a silent store) ends the run, even inside a collective; 0 = off"}, timeout_seconds(&C::heartbeat_timeout_s, true)},
        // LlamaFactory keys accepted so its configs run unchanged
        {{"ddp_timeout", "int >= 1", "null", "LlamaFactory's name for comm_timeout_s (seconds); values above a week (LlamaFactory's examples use 180000000) mean a week"}, [](C& c, const std::string& k, const Value& v) { c.comm_timeout_s = static_cast<double>(std::min<int64_t>(as_int(k, v, 1, "an integer >= 1 (seconds)"), static_cast<int64_t>(kMaxTimeoutSeconds))); }},
        {{"deepspeed", "string or mapping", "null", "a DeepSpeed config: not read; FSDP (fsdp_config) does what ZeRO does, over every rank by default, and the run lists the key as ignored"}, [](C& c, const std::string& k, const Value& v) {
           c.deepspeed = v.node.IsScalar() ? v.node.Scalar() : "(inline config)";
           c.ignored_keys.emplace_back(k, "the DeepSpeed config is not read; FSDP shards parameters, gradients and optimizer state as ZeRO-3 does (fsdp_config)");
         }},
        {{"hyper_parallel_args", "string", "null", "HyperParallel's LlamaFactory JSON (tp_size, cp_size, ep_size, efsdp_size, fsdp_size, param_dtype, reduce_dtype, reshard_after_forward, activation_mode): its entries set accelerator.* and fsdp_config.* keys"}, text(&C::hyper_parallel_args)},
        {{"hyper_parallel_cp_size", "int >= 1", "1", "LlamaFactory's name for accelerator.cp_size"}, parallel_degree(&AcceleratorConfig::cp_size)},
        {{"report_to", "none | all | tensorboard | wandb | mlflow | swanlab | ... or a list", "none", "tensorboard (or all): TensorBoard event files in logging_dir; network trackers (wandb, mlflow, ...) are not contacted and are listed as ignored; trainer_log.jsonl always has the metrics"}, set_report_to},
        {{"logging_dir", "string", "null", "folder of the TensorBoard event files; null: output_dir/runs/<date>_<host>, as HF's Trainer"}, text(&C::logging_dir)},
        {{"trust_remote_code", "bool", "false", "no effect: nothing from a model folder is ever executed"}, boolean(&C::trust_remote_code)},
        // fsdp_config
        {{"fsdp_config.dp_shard_size", "int, -1 or >= 1", "-1", "ranks one parameter is sharded over; world / dp_shard_size replicas (HSDP); -1: all"}, minus_one_or_positive([](C& c) -> int64_t& { return c.fsdp_config.dp_shard_size; })},
        {{"fsdp_config.edp_shard_size", "int, -1 or >= 1", "-1", "with ep_size > 1: how many ranks shard each expert's weights (FSDP over the experts, the edp axis); dp_shard_size x tp_size = edp_shard_size x ep_size, -1 infers it"}, minus_one_or_positive([](C& c) -> int64_t& { return c.fsdp_config.edp_shard_size; })},
        {{"fsdp_config.reshard_after_forward", "bool or int >= 2", "true", "free full parameters after forward; k: keep them sharded over k ranks"}, [](C& c, const std::string& k, const Value& v) {
           bool b = false;
           int64_t n = 0;
           if (v.node.IsScalar() && YAML::convert<bool>::decode(v.node, b)) {
             c.fsdp_config.reshard_after_forward = b ? 1 : 0;
           } else if (v.node.IsScalar() && YAML::convert<int64_t>::decode(v.node, n) && n >= 2) {
             c.fsdp_config.reshard_after_forward = n;
           } else {
             bad_value(k, v, "true, false or an integer >= 2");
           }
         }},
        {{"fsdp_config.reshard_after_backward", "bool", "true", "free full parameters after a backward during gradient accumulation"}, [](C& c, const std::string& k, const Value& v) { c.fsdp_config.reshard_after_backward = as_bool(k, v); }},
        {{"fsdp_config.forward_prefetch_depth", "int >= 0", "1", "units all-gathered ahead in forward"}, [](C& c, const std::string& k, const Value& v) { c.fsdp_config.forward_prefetch_depth = as_int(k, v, 0, "an integer >= 0"); }},
        {{"fsdp_config.backward_prefetch_depth", "int >= 0", "1", "units all-gathered ahead in backward"}, [](C& c, const std::string& k, const Value& v) { c.fsdp_config.backward_prefetch_depth = as_int(k, v, 0, "an integer >= 0"); }},
        {{"fsdp_config.layers_per_unit", "int >= 1", "1", "decoder layers per FSDP unit: one all-gather and one reduce-scatter per unit; more: fewer, larger collectives (small models), the unit's full parameters held longer"}, [](C& c, const std::string& k, const Value& v) { c.fsdp_config.layers_per_unit = as_int(k, v, 1, "an integer >= 1"); }},
        {{"fsdp_config.comm_fusion", "bool", "true", "one collective per unit (false: one per parameter)"}, [](C& c, const std::string& k, const Value& v) { c.fsdp_config.comm_fusion = as_bool(k, v); }},
        {{"fsdp_config.mix_precision.param_dtype", "float32 | bfloat16", "float32", "dtype of all-gathered parameters and compute"}, dtype(&MixPrecisionConfig::param_dtype)},
        {{"fsdp_config.mix_precision.reduce_dtype", "float32 | bfloat16", "float32", "dtype of gradient reductions"}, dtype(&MixPrecisionConfig::reduce_dtype)},
        {{"fsdp_config.mix_precision.output_dtype", "float32 | bfloat16", "float32", "dtype of the model's outputs"}, dtype(&MixPrecisionConfig::output_dtype)},
        {{"fsdp_config.enable_offload", "bool", "false", "keep sharded parameters and gradients in host memory"}, [](C& c, const std::string& k, const Value& v) { c.fsdp_config.enable_offload = as_bool(k, v); }},
        {{"fsdp_config.replicate_params", "list of globs", "[]", "parameters kept whole on every rank, gradients all-reduced (e.g. \"*norm*\")"}, [](C& c, const std::string& k, const Value& v) { c.fsdp_config.replicate_params = as_string_list(k, v, "a list of glob patterns"); }},
        // accelerator
        {{"accelerator.tp_size", "int >= 1", "1", "tensor parallel degree: attention heads and MLP features split over tp ranks (docs/tp.md)"}, parallel_degree(&AcceleratorConfig::tp_size)},
        {{"accelerator.sequence_parallel", "bool", "false", "with tp_size > 1: norms and the residual stream sharded over the sequence"}, [](C& c, const std::string& k, const Value& v) { c.accelerator.sequence_parallel = as_bool(k, v); }},
        {{"accelerator.loss_parallel", "bool", "false", "with tp_size > 1: the head split over the vocabulary, cross-entropy on the sharded logits"}, [](C& c, const std::string& k, const Value& v) { c.accelerator.loss_parallel = as_bool(k, v); }},
        {{"accelerator.cp_size", "int >= 1", "1", "context parallel degree: each row's sequence split over this many ranks (zigzag, load-balanced), attention across them by cp_algorithm (docs/cp.md); FSDP shards over dp_shard_size x cp_size"}, parallel_degree(&AcceleratorConfig::cp_size)},
        {{"accelerator.cp_algorithm", "ulysses | allgather | ring | hybrid", "ring", "with cp_size > 1: ulysses (all-to-all to head-sharded; heads and kv heads per tp rank divide by it), allgather (K/V gathered), ring (K/V blocks passed around, online softmax), hybrid (Ulysses groups of ulysses_degree inside a ring)"}, [](C& c, const std::string& k, const Value& v) { c.accelerator.cp_algorithm = as_choice(k, v, {"ulysses", "allgather", "ring", "hybrid"}); }},
        {{"accelerator.ulysses_degree", "int >= 0", "0", "with cp_size > 1: ranks per Ulysses group; 0 = the algorithm's own (cp_size for ulysses, 1 for allgather and ring); hybrid needs 1 < it < cp_size dividing cp_size; allgather with it > 1 gathers K/V between Ulysses groups"}, [](C& c, const std::string& k, const Value& v) { c.accelerator.ulysses_degree = as_int(k, v, 0, "an integer >= 0"); }},
        {{"accelerator.ep_size", "int >= 1", "1", "expert parallel degree: the experts of each MoE layer divided over this many ranks, tokens sent to them by all-to-all (docs/ep.md); must divide num_experts and dp_shard_size x cp_size x tp_size"}, parallel_degree(&AcceleratorConfig::ep_size)},
        {{"accelerator.pp_size", "int >= 1", "1", "pipeline parallel degree: the decoder layers split into stages over this many ranks, activations and gradients passed between them (docs/pp.md); outermost axis of the mesh"}, parallel_degree(&AcceleratorConfig::pp_size)},
        {{"accelerator.pp_microbatches", "int >= 1 or null", "null", "with pp_size > 1: micro-batches of per_device_train_batch_size rows per step through the pipeline (the step's gradient accumulation); null: gradient_accumulation_steps"}, [](C& c, const std::string& k, const Value& v) { c.accelerator.pp_microbatches = as_int(k, v, 1, "an integer >= 1"); }},
        {{"accelerator.pp_schedule", "gpipe | 1f1b | interleaved_1f1b | zero_bubble", "1f1b", "with pp_size > 1: the order of forwards and backwards on each rank (docs/pp.md)"}, [](C& c, const std::string& k, const Value& v) { c.accelerator.pp_schedule = as_choice(k, v, {"gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"}); }},
        {{"accelerator.pp_virtual_stages", "int >= 1", "1", "with pp_schedule interleaved_1f1b: stages per rank (rank r holds stages r, r + pp_size, ...); pp_microbatches a multiple of pp_size"}, [](C& c, const std::string& k, const Value& v) { c.accelerator.pp_virtual_stages = as_int(k, v, 1, "an integer >= 1"); }},
        {{"accelerator.pp_layers", "list of layer ranges", "[]", "with pp_size > 1: each stage's decoder layers in order, e.g. [0-7, 8-15] (inclusive); []: balanced, the embedding and the head counted as a layer each"}, [](C& c, const std::string& k, const Value& v) { c.accelerator.pp_layers = as_string_list(k, v, "a list of layer ranges like 0-7"); }},
        // activation checkpointing
        {{"activation_checkpoint.mode", "off | full | selective", "off", "full: each checkpointed decoder layer keeps only its input in forward and runs again in backward; selective: less of the layer is recomputed, as activation_checkpoint.selective_policy says; same numbers, less memory, more compute (docs/memory.md)"}, [](C& c, const std::string& k, const Value& v) { c.activation_checkpoint.mode = as_choice(k, v, {"off", "full", "selective"}); }},
        {{"activation_checkpoint.every", "int >= 1", "1", "checkpoint decoder layers 0, every, 2 x every, ... (1: all)"}, [](C& c, const std::string& k, const Value& v) { c.activation_checkpoint.every = as_int(k, v, 1, "an integer >= 1"); }},
        {{"activation_checkpoint.selective_policy", "op | attention_core", "op", "with mode selective: op keeps every Linear's output and recomputes the rest of the layer (norms, rotary, attention core, activations) without rerunning a projection's GEMM (an op-level policy of torchtitan's kind); attention_core recomputes only scores and softmax from q, k and v (Megatron's; needs the eager attention)"}, [](C& c, const std::string& k, const Value& v) { c.activation_checkpoint.selective_policy = as_choice(k, v, {"op", "attention_core"}); }},
        {{"activation_checkpoint.swap_inputs", "bool", "false", "with mode full: each checkpointed layer's kept input moves to a host pool after its forward and comes back one layer ahead in backward; exact, traffic in train_summary.json (on this CPU build host and device are one memory: docs/memory.md)"}, [](C& c, const std::string& k, const Value& v) { c.activation_checkpoint.swap_inputs = as_bool(k, v); }},
        {{"chunked_loss.enabled", "auto | bool", "auto", "the head and cross-entropy on chunk_size tokens at a time: the [tokens x vocab] logits never exist whole (same numbers to rounding; a plain head fused with the loss per chunk, no recompute; a tensor-parallel head recomputes each chunk's logits in backward; docs/memory.md); auto: on where a micro-batch's fp32 logits would take 256 MiB or more and span two chunks (the banner says which and why)"}, [](C& c, const std::string& k, const Value& v) { c.chunked_loss.enabled = as_bool_or_auto(k, v); }},
        {{"chunked_loss.chunk_size", "auto | int >= 1", "auto", "tokens per chunk of the chunked loss; auto: as many as keep one chunk's fp32 logits near 128 MiB, rounded up to a multiple of 128 (128 to 4096 tokens; 256 for a 152 k vocabulary)"}, [](C& c, const std::string& k, const Value& v) { c.chunked_loss.chunk_size = is_auto(v) ? std::nullopt : std::optional<int64_t>(as_int(k, v, 1, "an integer >= 1 or auto")); }},
        {{"optimizer_offload.dir", "string", "\"\"", "keep AdamW's moments (and, with bf16 compute, the fp32 master shards) in a file in this directory (local disk, not tmpfs), each parameter's read ahead before its update and released after: resident optimizer state about one parameter's; same numbers (docs/optimizers.md); \"\": in memory"}, [](C& c, const std::string& k, const Value& v) { c.optimizer_offload_dir = as_string(k, v); }},
        // muon_config (optim: muon)
        {{"muon_config.lr", "float > 0 or null", "null", "Muon's learning rate (scheduled like learning_rate); null: learning_rate"}, [](C& c, const std::string& k, const Value& v) { c.muon_config.lr = as_float(k, v, 0, INFINITY, true, false, "a number > 0"); c.muon_config.set = true; }},
        {{"muon_config.momentum", "float in [0, 1)", "0.95", "Muon's momentum (buffer.lerp(grad, 1 - momentum))"}, [](C& c, const std::string& k, const Value& v) { c.muon_config.momentum = as_float(k, v, 0, 1, false, true, "a number in [0, 1)"); c.muon_config.set = true; }},
        {{"muon_config.nesterov", "bool", "true", "Nesterov momentum: orthogonalise grad.lerp(buffer, momentum) instead of the buffer"}, [](C& c, const std::string& k, const Value& v) { c.muon_config.nesterov = as_bool(k, v); c.muon_config.set = true; }},
        {{"muon_config.ns_steps", "int >= 1", "5", "Newton-Schulz iterations per step"}, [](C& c, const std::string& k, const Value& v) { c.muon_config.ns_steps = as_int(k, v, 1, "an integer >= 1"); c.muon_config.set = true; }},
        {{"muon_config.weight_decay", "float >= 0 or null", "null", "Muon's decoupled weight decay; null: weight_decay"}, [](C& c, const std::string& k, const Value& v) { c.muon_config.weight_decay = as_float(k, v, 0, INFINITY, false, false, "a number >= 0"); c.muon_config.set = true; }},
        {{"muon_config.adjust_lr", "match_rms_adamw | original", "match_rms_adamw", "the update's scale: 0.2 x sqrt(max(rows, cols)) (AdamW's RMS, Moonlight) or sqrt(max(1, rows / cols)) (Keller Jordan's)"}, [](C& c, const std::string& k, const Value& v) { c.muon_config.adjust_lr = as_choice(k, v, {"match_rms_adamw", "original"}); c.muon_config.set = true; }},
        {{"gradient_checkpointing", "bool", "false", "HF's switch: true means activation_checkpoint.mode: full"}, boolean(&C::gradient_checkpointing)},
        {{"disable_gradient_checkpointing", "bool", "false", "LlamaFactory's switch: true means activation_checkpoint.mode: off (LlamaFactory checkpoints by default; here it is off unless asked for)"}, boolean(&C::disable_gradient_checkpointing)},
    };
    return t;
  }();
  return table;
}

const std::set<std::string>& sections() {
  static const std::set<std::string> s = {"fsdp_config", "fsdp_config.mix_precision", "accelerator", "model", "activation_checkpoint", "chunked_loss", "muon_config", "optimizer_offload", "dataset_file"};
  return s;
}

const KeyDef* find_key(const std::string& key) {
  for (const auto& d : key_table()) {
    if (d.info.key == key) return &d;
  }
  return nullptr;
}

std::vector<std::string> all_keys() {
  std::vector<std::string> keys;
  for (const auto& d : key_table()) keys.push_back(d.info.key);
  return keys;
}

}  // namespace hyperparallel::train
