// YAML + command line -> TrainConfig, with one-line errors. See train/train_config.h.
#include "hyperparallel/train/train_config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "hyperparallel/cp/cp_options.h"
#include "hyperparallel/platform/suggest.h"
#include "hyperparallel/platform/user_error.h"
#include "config_values.h"
#include "hyperparallel_yaml.h"
#include "llamafactory_compat.h"
#include "train_config_keys.h"

namespace hyperparallel::train {
namespace {

std::string unknown_key_message(const std::string& key, const std::string& source) {
  // Suggest among full keys and, for a misplaced leaf, among the leaves' full keys.
  std::vector<std::string> keys = all_keys();
  std::string hint = did_you_mean(key, keys);
  if (hint.empty()) {
    const std::string leaf = key.substr(key.rfind('.') == std::string::npos ? 0 : key.rfind('.') + 1);
    for (const auto& k : keys) {
      if (k.size() > leaf.size() && k.compare(k.size() - leaf.size(), leaf.size(), leaf) == 0 && k[k.size() - leaf.size() - 1] == '.') {
        hint = " (did you mean '" + k + "'?)";
      }
    }
  }
  return source + ": unknown key " + excerpt(key) + hint + "; every key is listed in docs/config.md";
}

// What a load found: our keys' values, the foreign keys it accepts, and every problem, so one
// run reports all of them.
struct Collected {
  std::map<std::string, Value> values;
  std::vector<std::pair<std::string, std::string>> ignored;  // foreign key -> why
  std::vector<std::string> problems;
};

// One key from `source`: ours, a foreign key (ignored, or refused when it turns a feature on)
// or unknown.
void take_key(const std::string& key, const Value& v, Collected& out) {
  if (find_key(key)) {
    if (v.node.IsNull()) {
      out.values.erase(key);  // the default
    } else {
      out.values[key] = v;
    }
    return;
  }
  const compat::ForeignKey* foreign = compat::find_foreign_key(key);
  if (!foreign) {
    out.problems.push_back(unknown_key_message(key, v.source));
  } else if (foreign->disposition == compat::Disposition::kRefusedWhenOn) {
    if (compat::turns_on(v.node)) out.problems.push_back(v.source + ": " + key + " is not supported: " + foreign->why);
  } else if (!v.node.IsNull()) {
    out.ignored.emplace_back(key, foreign->why);
  }
}

// Flattens a YAML mapping into key -> value, descending into the sections.
// A key given twice is an error naming both lines: YAML's "last one wins" would silently drop one.
void collect(const YAML::Node& map, const std::string& prefix, const std::string& source, Collected& out,
             std::map<std::string, int>& lines) {
  for (const auto& item : map) {
    if (!item.first.IsScalar()) throw UserError(source + ": keys must be plain names");
    const std::string key = prefix + item.first.Scalar();
    const int line = item.first.Mark().line + 1;
    const auto [seen, fresh] = lines.emplace(key, line);
    if (!fresh) {
      throw UserError(source + ": key " + excerpt(key) + " is given twice (lines " + std::to_string(seen->second) + " and " +
                      std::to_string(line) + "); keep one");
    }
    if (sections().count(key)) {
      if (item.second.IsNull()) continue;
      if (!item.second.IsMap()) throw UserError(source + ": " + key + " must be a mapping of its keys (see docs/config.md)");
      collect(item.second, key + ".", source, out, lines);
      continue;
    }
    take_key(key, {item.second, source}, out);
  }
}

// hyper_parallel_args' entries fill the keys the YAML leaves unset; a key set both ways to
// different values is a problem (which one was meant?).
void merge_hyper_parallel_args(Collected& out) {
  const auto path = out.values.find("hyper_parallel_args");
  if (path == out.values.end() || !path->second.node.IsScalar()) return;
  const std::string file = path->second.node.Scalar();
  for (auto& [key, node] : compat::read_hyper_parallel_args(file)) {
    const auto given = out.values.find(key);
    if (given == out.values.end()) {
      out.values[key] = {node, "hyper_parallel_args " + file};
    } else if (given->second.source != "command line" && YAML::Dump(given->second.node) != YAML::Dump(node)) {
      out.problems.push_back(given->second.source + ": " + key + " is " + excerpt(YAML::Dump(given->second.node)) +
                             " but hyper_parallel_args " + file + " says " + excerpt(YAML::Dump(node)) + "; set it in one place");
    }
  }
}

// HyperParallel's YAML, translated into our keys (train/hyperparallel_yaml.h).
void take_translation(const hp_yaml::Translation& t, const std::string& source, Collected& out) {
  for (const auto& [key, node] : t.values) take_key(key, {node, source}, out);
  for (const auto& [key, why] : t.ignored) out.ignored.emplace_back(key, why);
  out.problems.insert(out.problems.end(), t.problems.begin(), t.problems.end());
}

void throw_problems(const std::vector<std::string>& problems) {
  if (problems.empty()) return;
  if (problems.size() == 1) throw UserError(problems[0]);
  std::string message = std::to_string(problems.size()) + " problems in the configuration:";
  for (const auto& p : problems) message += "\n  " + p;
  throw UserError(message);
}

// stage pt, as LlamaFactory reads it: packing unset means on (data_args.packing = stage == "pt"),
// and neat_packing is refused ("`neat_packing` cannot be set as True except SFT"): pretraining
// blocks attend across documents. Needs to know which keys were given, so it runs on `collected`.
void apply_stage_pt(TrainConfig& c, const Collected& collected) {
  if (c.stage != "pt") return;
  const auto neat = collected.values.find("neat_packing");
  if (neat != collected.values.end() && as_bool("neat_packing", neat->second)) {
    throw UserError(neat->second.source + ": neat_packing: true applies to stage sft only (LlamaFactory refuses it too); stage pt "
                    "packs texts into blocks that attend across documents: remove neat_packing (packing: false gives one row per text)");
  }
  if (!collected.values.count("packing")) c.packing = true;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw UserError(message);
}

void check_dataset_file(const data::DatasetFile& f, const std::string& stage) {
  const data::DatasetFile defaults;
  if (f.path.empty()) {
    for (const auto& [key, set] : {std::pair{"formatting", f.formatting != defaults.formatting}, {"column", !f.column.empty()},
                                   {"role_tag", !f.role_tag.empty()}, {"content_tag", !f.content_tag.empty()},
                                   {"text_template", !f.text_template.empty()}}) {
      require(!set, std::string("dataset_file.") + key + " describes the file dataset_file.path names; set dataset_file.path");
    }
  }
  require(stage == "pt" || f.text_template.empty(),
          "dataset_file.text_template renders the texts of stage pt; with stage sft the records are conversations "
          "(dataset_file.column / role_tag / content_tag), or set stage: pt");
}

void check_combinations(const TrainConfig& c) {
  require(!c.model_name_or_path.empty(), "model_name_or_path is required: a Hugging Face model folder or a debug flavour such as qwen3-debug");
  require(!c.output_dir.empty(), "output_dir is required: the folder for logs, checkpoints and the exported model");
  require(c.finetuning_type == "full", "finetuning_type: " + c.finetuning_type + " is not supported yet; use finetuning_type: full");
  require(c.use_hyper_parallel, "use_hyper_parallel: false selects another backend in LlamaFactory; hyperparallel train always runs this one, so drop the key or set it true");
  require(!c.fp16, "fp16: true is not supported: CPU kernels have no fast float16 matmul and float16 training needs loss scaling; use bf16: true (same memory, fp32's range)");
  check_dataset_file(c.dataset_file, c.stage);
  if (c.do_train) {
    require(!c.dataset.empty() || !c.dataset_file.path.empty() || !c.tokenized_path.empty(),
            "dataset is required to train: names from dataset_dir/dataset_info.json or a built-in one (synthetic_reverse, "
            "synthetic_addition), a file by its path (dataset_file.path), or tokenized rows saved before (tokenized_path)");
    require(c.stage == "pt" || !c.chat_template.empty(),
            "template is required for stage sft: default, llama2, llama3, qwen, qwen3 or qwen3_nothink");
  }
  if (c.stage == "pt") {
    // LlamaFactory: "`train_on_prompt` or `mask_history` cannot be set as True except SFT."
    require(!c.train_on_prompt && !c.mask_history,
            std::string(c.train_on_prompt ? "train_on_prompt" : "mask_history") +
                ": true applies to stage sft only; stage pt takes the loss on every token (LlamaFactory refuses it too); remove it");
    require(c.heldout_eval_samples == 0,
            "heldout_eval_samples answers chat prompts of the built-in synthetic datasets, which stage pt does not train on; set heldout_eval_samples: 0");
  }
  const AcceleratorConfig& a = c.accelerator;
  require(a.pp_size > 1 || (a.pp_schedule == "1f1b" && a.pp_virtual_stages == 1 && !a.pp_microbatches && a.pp_layers.empty()),
          "accelerator.pp_schedule, pp_virtual_stages, pp_microbatches and pp_layers apply with pipeline parallelism (pp_size > 1); set pp_size or remove them");
  require(a.pp_virtual_stages == 1 || a.pp_schedule == "interleaved_1f1b",
          "accelerator.pp_virtual_stages > 1 needs pp_schedule: interleaved_1f1b (the other schedules run one stage per rank)");
  require(!a.pp_microbatches || c.gradient_accumulation_steps == 1 || c.gradient_accumulation_steps == *a.pp_microbatches,
          "accelerator.pp_microbatches " + std::to_string(a.pp_microbatches.value_or(0)) + " and gradient_accumulation_steps " +
              std::to_string(c.gradient_accumulation_steps) + " both set a step's micro-batches; give one of them");
  require(a.cp_size > 1 || (a.cp_algorithm == "ring" && a.ulysses_degree == 0),
          "accelerator.cp_algorithm and ulysses_degree apply with context parallelism (cp_size > 1); set cp_size or remove them");
  if (a.cp_size > 1) {
    try {
      cp::resolved_ulysses_degree({a.cp_algorithm, a.ulysses_degree, 1}, a.cp_size);
    } catch (const UserError& e) {
      throw UserError(std::string("accelerator.") + e.what());
    }
  }
  require(!a.sequence_parallel || a.tp_size > 1, "accelerator.sequence_parallel needs tp_size > 1 (it shards over the tp ranks); set tp_size or remove it");
  require(!a.loss_parallel || a.tp_size > 1, "accelerator.loss_parallel needs tp_size > 1 (it shards the head over the tp ranks); set tp_size or remove it");
  const bool evaluates = c.do_eval || c.eval_strategy != "no" || c.eval_on_start;
  const bool has_eval_rows = !c.eval_dataset.empty() || c.val_size > 0;
  require(!(evaluates && c.do_train && !has_eval_rows),
          std::string(c.eval_strategy != "no" ? "eval_strategy: " + c.eval_strategy : c.do_eval ? "do_eval" : "eval_on_start") +
              " needs rows to evaluate: set eval_dataset (dataset names) or val_size (a fraction or count of the training rows)");
  require(c.eval_dataset.empty() || c.val_size == 0, "val_size and eval_dataset both say where the eval rows come from; keep one (LlamaFactory refuses both too)");
  require(!(c.mask_history && c.train_on_prompt), "mask_history and train_on_prompt contradict each other (the last response only vs every token); keep one");
  const LrSchedulerKwargs& kw = c.lr_scheduler_kwargs;
  if (c.lr_scheduler_type == "cosine_with_min_lr") {
    require(kw.min_lr.has_value() != kw.min_lr_rate.has_value(),
            "lr_scheduler_type: cosine_with_min_lr needs exactly one of lr_scheduler_kwargs.min_lr or lr_scheduler_kwargs.min_lr_rate "
            "(e.g. lr_scheduler_kwargs: {min_lr_rate: 0.1})");
  }
  if (c.lr_scheduler_type == "polynomial") {
    require(c.learning_rate > kw.lr_end, "lr_scheduler_type: polynomial decays learning_rate to lr_scheduler_kwargs.lr_end (" +
                                             std::to_string(kw.lr_end) + "), which must be smaller than learning_rate");
  }
  require(!(c.chunked_loss.enabled.value_or(false) && a.sequence_parallel && a.loss_parallel),
          "chunked_loss with sequence_parallel and loss_parallel is not supported yet (the head's input is sequence-sharded); "
          "turn off chunked_loss.enabled or one of them");
  require(!(c.disable_gradient_checkpointing && (c.gradient_checkpointing || c.activation_checkpoint.mode != "off")),
          std::string("disable_gradient_checkpointing: true contradicts ") +
              (c.gradient_checkpointing ? "gradient_checkpointing: true" : "activation_checkpoint.mode: " + c.activation_checkpoint.mode) +
              "; keep one");
  require(c.activation_checkpoint.selective_policy == "op" ||
              (c.activation_checkpoint.mode == "selective" && !c.gradient_checkpointing && !c.disable_gradient_checkpointing),
          "activation_checkpoint.selective_policy: " + c.activation_checkpoint.selective_policy +
              " applies with activation_checkpoint.mode: selective; set that mode or remove selective_policy");
  require(!c.muon_config.set || c.optim == "muon", "muon_config applies with optim: muon (optim is " + c.optim + "); set optim: muon or remove muon_config");
  require(c.fsdp_config.edp_shard_size == -1 || a.ep_size > 1,
          "fsdp_config.edp_shard_size applies with expert parallelism (accelerator.ep_size > 1); set ep_size or remove it");
}

}  // namespace

const std::vector<ConfigKeyInfo>& config_schema() {
  static const std::vector<ConfigKeyInfo> schema = [] {
    std::vector<ConfigKeyInfo> s;
    for (const auto& d : key_table()) s.push_back(d.info);
    return s;
  }();
  return schema;
}

std::string config_schema_text() {
  std::string out;
  for (const auto& k : config_schema()) out += k.key + ": " + k.type + " = " + k.default_text + "\n";
  return out;
}

TrainConfig load_train_config(const std::string& yaml_path, const std::vector<std::string>& overrides) {
  Collected collected;
  bool hyperparallel_dialect = false, cp_algorithm_when_cp = false;
  if (!yaml_path.empty()) {
    YAML::Node root;
    try {
      root = YAML::LoadFile(yaml_path);
    } catch (const YAML::BadFile&) {
      throw UserError("cannot read the config file " + yaml_path);
    } catch (const YAML::Exception& e) {
      throw UserError(yaml_path + " is not valid YAML: " + e.what());
    }
    if (!root.IsNull()) {
      if (!root.IsMap()) throw UserError(yaml_path + " must be a mapping of keys to values (see docs/config.md)");
      hyperparallel_dialect = hp_yaml::is_hyperparallel_config(root);
      if (hyperparallel_dialect) {
        const hp_yaml::Translation t = hp_yaml::translate(root, yaml_path);
        cp_algorithm_when_cp = t.cp_algorithm_when_cp;
        take_translation(t, yaml_path, collected);
      } else {
        std::map<std::string, int> lines;
        collect(root, "", yaml_path, collected, lines);
      }
    }
  }
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0) throw UserError("command line: '" + o + "' is not --key=value");
    const std::string key = o.substr(0, eq);
    if (sections().count(key)) throw UserError("command line: " + key + " is a section; set its keys, e.g. --" + key + ".<key>=value");
    YAML::Node node;
    try {
      node = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      throw UserError("command line: " + key + ": '" + o.substr(eq + 1) + "' is not a YAML value (" + e.what() + ")");
    }
    if (hyperparallel_dialect && !find_key(key)) {  // HyperParallel's spelling, --training.train_iters=5
      take_translation(hp_yaml::translate_override(key, node), "command line", collected);
    } else {
      take_key(key, {node, "command line"}, collected);
    }
  }
  // A `when: cp` attention wrapper is inactive without context parallelism.
  const auto cp_size = collected.values.find("accelerator.cp_size");
  if (cp_algorithm_when_cp && (cp_size == collected.values.end() || YAML::Dump(cp_size->second.node) == "1")) {
    collected.values.erase("accelerator.cp_algorithm");
  }
  try {
    merge_hyper_parallel_args(collected);
  } catch (const UserError& e) {
    collected.problems.push_back(e.what());
  }
  TrainConfig config;
  for (const auto& d : key_table()) {
    auto it = collected.values.find(d.info.key);
    if (it == collected.values.end()) continue;
    try {
      d.set(config, d.info.key, it->second);
    } catch (const UserError& e) {
      collected.problems.push_back(e.what());
    }
  }
  throw_problems(collected.problems);
  apply_stage_pt(config, collected);
  if (config.eval_strategy != "no") config.do_eval = true;  // as HF's TrainingArguments
  config.ignored_keys.insert(config.ignored_keys.end(), collected.ignored.begin(), collected.ignored.end());
  for (const auto& tracker : config.report_to) {
    if (tracker == "tensorboard") continue;  // written (tensorboard_writer.h)
    config.ignored_keys.emplace_back("report_to: " + tracker, tracker == "all" ? "every tracker but tensorboard is left out: none is contacted over the network; TensorBoard files are written"
                                                                               : "no experiment tracker is contacted; the metrics are in trainer_log.jsonl (report_to: tensorboard writes TensorBoard files)");
  }
  check_combinations(config);
  return config;
}

}  // namespace hyperparallel::train
