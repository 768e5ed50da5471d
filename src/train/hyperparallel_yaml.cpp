// HyperParallel's trainer YAML. See hyperparallel_yaml.h and docs/hyperparallel-yaml.md.
#include "hyperparallel_yaml.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>

#include "hyperparallel/platform/suggest.h"

namespace hyperparallel::train::hp_yaml {
namespace {

// A `_target_` by the end of its dotted path (module paths move between HyperParallel
// versions; the builder's name does not), the place it may appear, and what it becomes here.
struct Target {
  const char* suffix;
  const char* place;  // the key holding it: model, optimizer, replace_module, ...
  const char* meaning;
  const char* value = "";  // what it sets here: a plan override's replacement, a cp algorithm, an optim
};

const std::vector<Target>& targets() {
  static const std::vector<Target> t = {
      {"AutoModelForCausalLM.from_pretrained", "model", "the Hugging Face folder, loaded by AutoModelForCausalLM::from_pretrained"},
      {"AutoTokenizer.from_pretrained", "tokenizer", "the folder's tokenizer.json (data/tokenizer.h)"},
      {"AdamW", "optimizer", "optim: adamw_torch (FusedAdamW; AdamW for every parameter)", "adamw_torch"},
      {"Muon", "optimizer", "optim: muon (Muon for the matrices, AdamW for the rest; optim/muon.h)", "muon"},
      {"MultiLRScheduler", "lr_scheduler", "the schedule of lr_decay_style over every param group"},
      {"build_online_text_dataset", "dataset", "the trainer's data pipeline (tokenize, template, cut at the sequence length)"},
      {"build_indexed_text_dataset", "dataset", "the trainer's data pipeline"},
      {"build_llm_dataset", "dataset", "the trainer's data pipeline"},
      {"build_llm_data_transform", "data_transform", "the trainer's tokenization and chat template"},
      {"DataLoader", "dataloader", "the trainer's global-batch sampler (data/batch_sampler.h)"},
      {"build_online_text_collate_fn", "collate_fn", "the trainer's collation (padding, labels, positions)"},
      {"build_indexed_collate_fn", "collate_fn", "the trainer's collation"},
      {"build_llm_collator", "collate_fn", "the trainer's collation"},
      {"build_llm_get_batch", "get_batch", "the trainer's split of each batch over the data-parallel and cp ranks"},
      {"ChatmlTemplate", "chat_template", "the template key's chat template (default: qwen3 for a Qwen model)"},
      {"ParallelBatch", "get_batch", "the trainer's split of each batch over the data-parallel and cp ranks"},
      {"rms_norm", "replace_module", "plan override fused_rms_norm", "fused_rms_norm"},
      {"attention", "replace_module", "plan override fused_qkv_attention", "fused_qkv_attention"},
      {"experts", "replace_module", "plan override grouped_experts", "grouped_experts"},
      {"ulysses_cp_wrapper", "inner_wrapper", "accelerator.cp_algorithm: ulysses", "ulysses"},
      {"ring_cp_wrapper", "inner_wrapper", "accelerator.cp_algorithm: ring", "ring"},
      {"allgather_cp_wrapper", "inner_wrapper", "accelerator.cp_algorithm: allgather", "allgather"},
      {"hybrid_cp_wrapper", "inner_wrapper", "accelerator.cp_algorithm: hybrid", "hybrid"},
      {"ep_compute_fn", "local_compute_fn", "the built-in expert dispatch (all-to-all) with grouped experts"},
  };
  return t;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

class Translator {
 public:
  Translator(Translation& out, std::string source) : out_(out), source_(std::move(source)) {}

  void document(const YAML::Node& root) {
    if (root["accelerator"] && root["accelerator"].IsMap()) {
      tp_ = root["accelerator"]["tp_size"] ? root["accelerator"]["tp_size"].as<int64_t>(1) : 1;
    }
    for (const auto& item : root) {
      const std::string section = item.first.Scalar();
      if (section == "plan_overrides") {
        plan_overrides(item.second);
      } else if (is_section(section)) {
        leaves(section, item.second);
      } else {
        problem(section + " is not a section of HyperParallel's trainer YAML this build reads (sections: model, training, "
                          "accelerator, fsdp_config, plan_overrides, mixed_precision, activation_checkpoint, compile, optimizer, "
                          "lr_scheduler, checkpoint, dataset, dataloader, debug)" +
                did_you_mean(section, kSections));
      }
    }
    finish();
  }

  // Our keys set so far, into the translation.
  void flush() {
    for (auto& [key, value] : set_) out_.values.emplace_back(key, value);
    set_.clear();
  }

  void leaf(const std::string& path, const YAML::Node& v) {
    const auto& rules = table();
    const auto exact = rules.find(path);
    if (exact != rules.end()) return exact->second(*this, path, v);
    for (const char* prefix : {"accelerator.", "fsdp_config.", "activation_checkpoint."}) {
      if (path.rfind(prefix, 0) == 0) return put(path, v);  // our keys, checked as ours
    }
    if (ends_with(path, "._target_")) {
      target(path, v, path.substr(0, path.size() - 9));
      return;
    }
    for (const char* prefix : {"dataset.", "dataloader.", "debug.", "compile."}) {
      if (path.rfind(prefix, 0) == 0) {
        return ignore(path, "the trainer's own data pipeline, sampler and eager execution do this part");
      }
    }
    std::vector<std::string> known;
    for (const auto& [key, rule] : rules) known.push_back(key);
    problem(path + " is not a key this build reads" + did_you_mean(path, known));
  }

 private:
  using Rule = std::function<void(Translator&, const std::string&, const YAML::Node&)>;
  static inline const std::vector<std::string> kSections = {"model",  "training",  "accelerator", "fsdp_config",  "plan_overrides",
                                                            "mixed_precision", "activation_checkpoint", "compile", "optimizer",
                                                            "lr_scheduler", "checkpoint", "dataset", "dataloader", "debug"};
  Translation& out_;
  std::string source_;
  int64_t tp_ = 1;
  std::map<std::string, YAML::Node> set_;  // our key -> value, to catch two sources disagreeing
  std::map<std::string, std::string> set_by_;
  std::string decay_style_ = "linear";
  double min_lr_ = 0;
  std::string model_path_;
  bool mock_data_ = false;

  static bool is_section(const std::string& s) { return std::find(kSections.begin(), kSections.end(), s) != kSections.end(); }

  void leaves(const std::string& path, const YAML::Node& v) {
    if (v.IsMap() && !table().count(path)) {  // a rule may take a whole mapping (role_map)
      for (const auto& item : v) leaves(path + "." + item.first.Scalar(), item.second);
      return;
    }
    leaf(path, v);
  }

  void problem(const std::string& what) { out_.problems.push_back(source_ + ": " + what); }
  void ignore(const std::string& key, const std::string& why) { out_.ignored.emplace_back(key, why); }

  void put(const std::string& key, const YAML::Node& v, const std::string& from = "") {
    const std::string by = from.empty() ? key : from;
    const auto it = set_.find(key);
    if (it != set_.end() && YAML::Dump(it->second) != YAML::Dump(v)) {
      problem(set_by_[key] + " and " + by + " disagree (" + excerpt(YAML::Dump(it->second)) + " vs " + excerpt(YAML::Dump(v)) +
              "); set one");
      return;
    }
    set_[key] = v;
    set_by_[key] = by;
  }

  static Rule to(const std::string& ours) {
    return [ours](Translator& t, const std::string& path, const YAML::Node& v) { t.put(ours, v, path); };
  }
  static Rule ignored(const std::string& why) {
    return [why](Translator& t, const std::string& path, const YAML::Node&) { t.ignore(path, why); };
  }

  const Target* target(const std::string& path, const YAML::Node& v, const std::string& place_path) {
    const std::string place = place_path.substr(place_path.rfind('.') == std::string::npos ? 0 : place_path.rfind('.') + 1);
    const std::string name = v.IsScalar() ? v.Scalar() : std::string();
    if (name.rfind("hyper_parallel.", 0) == 0 || name.rfind("hyper_models.", 0) == 0 || name.rfind("transformers.", 0) == 0) {
      for (const Target& t : targets()) {
        if (place == t.place && ends_with(name, t.suffix)) return &t;
      }
    }
    std::string builtins;
    for (const Target& t : targets()) {
      if (place == t.place) builtins += std::string(builtins.empty() ? "" : ", ") + "*" + t.suffix;
    }
    problem(path + ": " + excerpt(name.empty() ? YAML::Dump(v) : name) + " is not one of HyperParallel's builders this build maps" +
            (builtins.empty() ? std::string(" (no _target_ is read here)") : " (built-ins for " + place + ": " + builtins + ")") +
            "; docs/hyperparallel-yaml.md lists them");
    return nullptr;
  }

  static const std::map<std::string, Rule>& table();

  void plan_overrides(const YAML::Node& list);
  void plan_override(const YAML::Node& e, const std::string& where);
  void finish();
};

const std::map<std::string, Translator::Rule>& Translator::table() {
  static const Rule save_checkpoints = [](Translator& t, const std::string& p, const YAML::Node& v) {
    t.put("save_strategy", YAML::Node(v.IsScalar() && v.Scalar() == "true" ? "steps" : "no"), p);
  };
  static const std::map<std::string, Rule> rules = {
      {"model._target_", [](Translator& t, const std::string& p, const YAML::Node& v) { t.target(p, v, "model"); }},
      {"model.pretrained_model_name_or_path",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         t.model_path_ = v.IsScalar() ? v.Scalar() : "";
         t.put("model_name_or_path", v, p);
       }},
      {"model.torch_dtype",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         const std::string d = v.IsScalar() ? v.Scalar() : "";
         if (d != "bfloat16" && d != "bf16" && d != "float32" && d != "fp32" && d != "auto") {
           return t.problem(p + ": " + excerpt(d) + " is not float32 or bfloat16 (float16 has no fast CPU matmul here)");
         }
         t.ignore(p, "parameters are fp32 masters here; mixed_precision.enabled: true computes in bf16");
       }},
      {"model.validate_placement", to("model.validate_placement")},
      {"model.num_hidden_layers", to("model.num_hidden_layers")},
      {"model.attn_implementation", ignored("attention runs on this project's own kernels (eager, fused, or the CP cores)")},
      {"model.force_hf", ignored("the model is always the Hugging Face architecture read from config.json")},
      {"model.ignore_mismatched_sizes", ignored("every tensor's shape is checked against the config; a mismatch is an error")},
      {"model.trust_remote_code", ignored("no Python code is run: only the built-in architectures load")},
      {"training.train_iters", to("max_steps")},
      {"training.train_steps", to("max_steps")},
      {"training.eval_iters", ignored("evaluation is do_eval / eval_strategy here; no eval pass runs unless asked for")},
      {"training.train_samples",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         if (!v.IsNull()) t.problem(p + " is not read here; give training.train_iters (optimizer steps)");
       }},
      {"training.global_batch_size", to("global_batch_size")},
      {"training.micro_batch_size", to("per_device_train_batch_size")},
      {"training.seed", to("seed")},
      {"training.log_interval", to("logging_steps")},
      {"training.max_grad_norm", to("max_grad_norm")},
      {"training.backend", ignored("this build communicates over Gloo on the CPU")},
      {"training.init_device", ignored("a Hugging Face folder is loaded without materialising what a rank does not hold")},
      {"training.enable_full_determinism", ignored("runs are deterministic for a seed")},
      {"training.loss_aggregation",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         if (!v.IsScalar() || v.Scalar() != "token_weighted") {
           t.problem(p + ": only token_weighted is implemented (the step's loss is the sum over the global batch's label "
                         "tokens over their count, on every layout)");
         }
       }},
      {"fsdp_config.requires_grad_sync",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         if (!v.IsScalar() || v.Scalar() != "true") t.problem(p + ": gradients are always synchronised once per step here; remove it");
       }},
      {"mixed_precision.enabled", to("bf16")},
      {"mixed_precision.param_dtype", to("fsdp_config.mix_precision.param_dtype")},
      {"mixed_precision.reduce_dtype", to("fsdp_config.mix_precision.reduce_dtype")},
      {"compile.enabled",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         if (v.IsScalar() && v.Scalar() == "true") t.ignore(p, "no graph compiler on this build: eager LibTorch");
       }},
      {"optimizer._target_",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         if (const Target* found = t.target(p, v, "optimizer")) {
           t.put("optim", YAML::Node(std::string(found->value)), p);
         }
       }},
      {"optimizer.no_decay_params",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         t.ignore(p, "weight decay skips biases and norm weights, as HF's Trainer groups them");
       }},
      {"optimizer.adamw_config.adamw_lr", to("learning_rate")},
      {"optimizer.adamw_config.adamw_weight_decay", to("weight_decay")},
      {"optimizer.adamw_config.adamw_eps", to("adam_epsilon")},
      {"optimizer.adamw_config.adamw_betas",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         if (!v.IsSequence() || v.size() != 2) return t.problem(p + " must be [beta1, beta2]");
         t.put("adam_beta1", v[0], p);
         t.put("adam_beta2", v[1], p);
       }},
      {"optimizer.muon_config.muon_lr", to("muon_config.lr")},
      {"optimizer.muon_config.muon_weight_decay", to("muon_config.weight_decay")},
      {"optimizer.muon_config.muon_momentum", to("muon_config.momentum")},
      {"optimizer.muon_config.muon_nesterov", to("muon_config.nesterov")},
      {"optimizer.muon_config.muon_ns_steps", to("muon_config.ns_steps")},
      {"optimizer.muon_config.muon_ns_variant", ignored("Newton-Schulz is the quintic iteration of optim/muon.h")},
      {"lr_scheduler._target_", [](Translator& t, const std::string& p, const YAML::Node& v) { t.target(p, v, "lr_scheduler"); }},
      {"lr_scheduler.lr_decay_style",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         const std::string s = v.IsScalar() ? v.Scalar() : "";
         if (s != "cosine" && s != "linear" && s != "constant") return t.problem(p + ": " + excerpt(s) + " is not cosine, linear or constant");
         t.decay_style_ = s;
       }},
      {"lr_scheduler.lr_config.lr", to("learning_rate")},
      {"lr_scheduler.lr_config.lr_warmup_steps", to("warmup_steps")},
      {"lr_scheduler.lr_config.min_lr",
       [](Translator& t, const std::string& p, const YAML::Node& v) { t.min_lr_ = v.IsScalar() ? v.as<double>(0.0) : 0.0; }},
      {"checkpoint.save_ckpt", save_checkpoints},
      {"checkpoint.enabled", save_checkpoints},  // the newer trainer's name
      {"checkpoint.save_interval", to("save_steps")},
      {"checkpoint.checkpoint_dir",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         if (v.IsScalar() && !v.Scalar().empty()) t.put("output_dir", v, p);
       }},
      {"checkpoint.restore_from",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         if (!v.IsNull() && v.IsScalar() && !v.Scalar().empty()) t.put("resume_from_checkpoint", v, p);
       }},
      {"dataset.data_path", to("dataset_file.path")},
      {"dataset.data_config.hf_dataset_name",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         if (!v.IsNull()) t.problem(p + ": nothing is downloaded here; save the dataset as a local .jsonl file and name it with dataset.data_path");
       }},
      {"dataset.data_transform.data_type",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         const std::string type = v.IsScalar() ? v.Scalar() : "";
         if (type == "conversation") {
           t.put("stage", YAML::Node("sft"), p);
           t.put("dataset_file.formatting", YAML::Node("sharegpt"), p);
         } else if (type == "plaintext") {
           t.put("stage", YAML::Node("pt"), p);
           t.put("dataset_file.formatting", YAML::Node("alpaca"), p);
         } else if (type == "pretokenized") {
           t.problem(p + ": pretokenized (Megatron .bin/.idx) data is not read here; give the texts as a .jsonl file "
                         "(data_type: plaintext) or the chats (data_type: conversation)");
         } else {
           t.problem(p + ": " + excerpt(type.empty() ? YAML::Dump(v) : type) + " is not conversation or plaintext");
         }
       }},
      {"dataset.data_transform.text_keys",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         if (v.IsSequence() && v.size() == 1 && v[0].IsScalar()) return t.put("dataset_file.column", v[0], p);
         if (!v.IsScalar()) return t.problem(p + ": a list of fields to try in turn is not read here; name the one field every record has");
         t.put("dataset_file.column", v, p);
       }},
      {"dataset.data_transform.role_key", to("dataset_file.role_tag")},
      {"dataset.data_transform.content_key", to("dataset_file.content_tag")},
      {"dataset.data_transform.text_template", to("dataset_file.text_template")},
      {"dataset.data_transform.role_map",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         if (!v.IsNull() && v.size() > 0) {
           t.problem(p + ": role aliases are not read here; the roles human|user, gpt|assistant, system, observation|tool and "
                         "function_call are understood as they are");
         }
       }},
      {"dataset.name", to("dataset")},
      {"dataset.dataset_dir", to("dataset_dir")},
      {"dataset.template", to("template")},
      {"dataset.data_config.mock_data",
       [](Translator& t, const std::string& p, const YAML::Node& v) {
         if (v.IsScalar() && v.Scalar() == "true") {
           t.mock_data_ = true;
           t.put("dataset", YAML::Node("synthetic_reverse"), p);
         }
       }},
      {"dataset.data_config.seq_length", to("cutoff_len")},
      {"dataset.data_transform.max_seq_len", to("cutoff_len")},
      {"dataset.model_assets.tokenizer._target_",
       [](Translator& t, const std::string& p, const YAML::Node& v) { t.target(p, v, "tokenizer"); }},
      {"dataset.model_assets.tokenizer.pretrained_model_name_or_path", to("tokenizer")},
  };
  return rules;
}

void Translator::plan_overrides(const YAML::Node& list) {
  if (!list.IsSequence()) return problem("plan_overrides must be a list of overrides");
  for (size_t i = 0; i < list.size(); ++i) plan_override(list[i], "plan_overrides[" + std::to_string(i) + "]");
}

// One override: a module replacement (replace_module) becomes ours; a CP attention wrapper
// (when: cp) the cp algorithm; an EP compute function (when: ep) is the built-in dispatch.
void Translator::plan_override(const YAML::Node& e, const std::string& where) {
  if (!e.IsMap()) return problem(where + " must be a mapping");
  const std::string when = e["when"] && e["when"].IsScalar() ? e["when"].Scalar() : "";
  if (!when.empty() && when != "tp" && when != "cp" && when != "ep") return problem(where + ".when: " + excerpt(when) + " is not tp, cp or ep");
  if (e["inner_wrapper"]) {
    const Target* t = target(where + ".inner_wrapper._target_", e["inner_wrapper"]["_target_"], "inner_wrapper");
    if (t) {
      put("accelerator.cp_algorithm", YAML::Node(std::string(t->value)), where + ".inner_wrapper");
      out_.cp_algorithm_when_cp = true;
    }
    return;
  }
  if (e["local_compute_fn"]) {
    target(where + ".local_compute_fn._target_", e["local_compute_fn"]["_target_"], "local_compute_fn");
    return ignore(where, "expert parallelism always dispatches by all-to-all to grouped experts (ep/expert_parallel.h)");
  }
  if (!e["replace_module"]) return problem(where + " needs replace_module, inner_wrapper or local_compute_fn");
  const Target* t = target(where + ".replace_module._target_", e["replace_module"]["_target_"], "replace_module");
  if (!t) return;
  if (tp_ > 1) {
    return ignore(where, "the fused replacements have no tensor-parallel plan yet: with tp_size > 1 the plain modules run "
                         "(the same numbers, slower)");
  }
  const std::string type = e["module_type"] && e["module_type"].IsScalar() ? e["module_type"].Scalar() : "";
  const std::string ours = t->value;
  std::vector<std::string> matches;
  if (e["match"] && e["match"].IsSequence()) {
    for (const auto& m : e["match"]) matches.push_back(m.Scalar());
  } else if (e["match"] && e["match"].IsScalar()) {
    matches.push_back(e["match"].Scalar());
  }
  if (matches.empty() || type.empty()) return problem(where + " needs match and module_type");
  YAML::Node list = set_.count("plan_overrides") ? set_["plan_overrides"] : YAML::Node(YAML::NodeType::Sequence);
  for (const auto& m : matches) {
    YAML::Node o;
    o["match"] = m;
    o["module_type"] = type.substr(type.rfind('.') == std::string::npos ? 0 : type.rfind('.') + 1);
    o["replace_module"] = ours;
    list.push_back(o);
  }
  set_["plan_overrides"] = list;
  set_by_["plan_overrides"] = "plan_overrides";
}

void Translator::finish() {
  if (decay_style_ == "cosine" && min_lr_ > 0) {
    put("lr_scheduler_type", YAML::Node("cosine_with_min_lr"), "lr_scheduler.lr_decay_style");
    YAML::Node kwargs;
    kwargs["min_lr"] = min_lr_;
    put("lr_scheduler_kwargs", kwargs, "lr_scheduler.lr_config.min_lr");
  } else {
    put("lr_scheduler_type", YAML::Node(decay_style_ == "constant" ? "constant_with_warmup" : decay_style_), "lr_scheduler.lr_decay_style");
  }
  // Our dialect's required keys, where HyperParallel's files leave them implicit.
  if (!set_.count("output_dir")) put("output_dir", YAML::Node("output/hyperparallel"), "(default)");
  if (mock_data_) {  // as in HyperParallel, mock data wins over a data_path and its transform
    if (set_.count("dataset_file.path")) ignore(set_by_["dataset_file.path"], "dataset.data_config.mock_data: true trains on the mock data");
    if (set_.count("stage") && set_by_["stage"] == "dataset.data_transform.data_type") set_.erase("stage");
    for (const char* key : {"dataset_file.path", "dataset_file.formatting", "dataset_file.column", "dataset_file.role_tag",
                            "dataset_file.content_tag", "dataset_file.text_template"}) {
      set_.erase(key);
    }
  } else if (!set_.count("dataset") && !set_.count("dataset_file.path")) {
    put("dataset", YAML::Node("synthetic_reverse"), "(default: mock data)");
  }
  if (!set_.count("template")) {
    std::string lower = model_path_;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    put("template", YAML::Node(lower.find("qwen") != std::string::npos ? "qwen3" : "default"), "(default)");
  }
  flush();
}

}  // namespace

bool is_hyperparallel_config(const YAML::Node& root) {
  if (!root.IsMap()) return false;
  if (root["training"] && root["training"].IsMap()) return true;
  return root["model"] && root["model"].IsMap() && root["model"]["pretrained_model_name_or_path"];
}

Translation translate(const YAML::Node& root, const std::string& source) {
  Translation out;
  Translator(out, source).document(root);
  return out;
}

Translation translate_override(const std::string& key, const YAML::Node& value) {
  Translation out;
  Translator t(out, "command line");
  t.leaf(key, value);
  t.flush();
  return out;
}

std::string target_table() {
  std::string out;
  for (const Target& t : targets()) out += std::string(t.place) + ": *" + t.suffix + " -> " + t.meaning + "\n";
  return out;
}

}  // namespace hyperparallel::train::hp_yaml
