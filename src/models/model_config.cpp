// config.json parsing and the built-in debug flavours. See models/model_config.h.
#include "hyperparallel/models/model_config.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hyperparallel/io/user_files.h"
#include "hyperparallel/platform/suggest.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::models {
namespace {

// Bounds on what a config.json may say, far above every published model (the largest
// vocabularies are ~256 k, hidden sizes ~16 k, layers ~128, experts ~512).
constexpr int64_t kMaxSize = int64_t{1} << 24;  // vocab, widths, positions
constexpr int64_t kMaxCount = 8192;              // layers, heads
constexpr int64_t kMaxExperts = 65536;
constexpr double kMaxParameters = 1e13;



using Json = nlohmann::ordered_json;

struct Family {
  const char* architecture;
  const char* model_type;
  const char* prefix;
};
constexpr Family kFamilies[] = {
    {"LlamaForCausalLM", "llama", "Llama"},
    {"Qwen2ForCausalLM", "qwen2", "Qwen2"},
    {"Qwen3ForCausalLM", "qwen3", "Qwen3"},
    {"Qwen3MoeForCausalLM", "qwen3_moe", "Qwen3Moe"},
};

std::string family_list() {
  std::string out;
  for (const auto& f : kFamilies) out += std::string(out.empty() ? "" : ", ") + f.architecture + " (" + f.model_type + ")";
  return out;
}

// Typed access to config keys; every failure names the key, the value and the file.
class Reader {
 public:
  Reader(const Json& json, std::string where) : json_(json), where_(std::move(where)) {}

  bool has(const char* key) const { return json_.contains(key) && !json_[key].is_null(); }

  // Sizes beyond `max_value` describe no model that exists; they are refused before anything is
  // allocated from them.
  int64_t integer(const char* key, std::optional<int64_t> fallback, int64_t min_value, int64_t max_value = kMaxSize) const {
    if (!has(key)) {
      if (fallback) return *fallback;
      throw UserError(where_ + ": required key " + key + " is missing");
    }
    const Json& v = json_[key];
    if (!v.is_number_integer() || v.get<int64_t>() < min_value || v.get<int64_t>() > max_value) {
      throw UserError(where_ + ": " + key + " = " + excerpt(v.dump(), 40, false) + " must be an integer in [" + std::to_string(min_value) +
                      ", " + std::to_string(max_value) + "]");
    }
    return v.get<int64_t>();
  }

  double number(const Json& obj, const char* key, double fallback, bool positive) const {
    if (!obj.contains(key) || obj[key].is_null()) return fallback;
    const Json& v = obj[key];
    if (!v.is_number() || (positive && v.get<double>() <= 0)) {
      throw UserError(where_ + ": " + key + " = " + v.dump() + (positive ? " must be a positive number" : " must be a number"));
    }
    return v.get<double>();
  }
  double number(const char* key, double fallback, bool positive) const { return number(json_, key, fallback, positive); }

  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!json_[key].is_boolean()) throw UserError(where_ + ": " + key + " = " + json_[key].dump() + " must be true or false");
    return json_[key].get<bool>();
  }

  std::string string(const char* key) const {
    if (!has(key)) return "";
    if (!json_[key].is_string()) throw UserError(where_ + ": " + key + " = " + json_[key].dump() + " must be a string");
    return json_[key].get<std::string>();
  }

  const Json& json() const { return json_; }
  const std::string& where() const { return where_; }

 private:
  const Json& json_;
  std::string where_;
};

const Family& pick_family(const Reader& r) {
  std::string architecture;
  if (r.has("architectures")) {
    const Json& a = r.json()["architectures"];
    if (!a.is_array() || a.empty() || !a[0].is_string()) {
      throw UserError(r.where() + ": architectures must be a list of class names, e.g. [\"Qwen3ForCausalLM\"]");
    }
    architecture = a[0].get<std::string>();
  }
  const std::string model_type = r.string("model_type");
  for (const auto& f : kFamilies) {
    if (!architecture.empty() ? architecture == f.architecture : model_type == f.model_type) return f;
  }
  throw UserError(r.where() + ": architecture '" + (architecture.empty() ? model_type : architecture) +
                  "' is not supported; supported: " + family_list());
}

// partial_rotary_factor (top level, or inside rope_parameters as `prefix` says) other than 1.
void refuse_partial_rotary(const Reader& r, const Json& obj, const std::string& prefix) {
  if (r.number(obj, "partial_rotary_factor", 1.0, true) != 1.0) {
    throw UserError(r.where() + ": " + prefix + "partial_rotary_factor = " + obj["partial_rotary_factor"].dump() +
                    " (rotary on part of each head) is not supported; the families here rotate the whole head");
  }
}

// One rope scaling object: 4.x's rope_scaling, or 5.x's rope_parameters (which also holds
// rope_theta). `what` names it in errors.
RopeScaling parse_rope_object(const Reader& r, const Json& j, const std::string& what) {
  RopeScaling s;
  if (!j.is_object()) throw UserError(r.where() + ": " + what + " must be an object or null");
  const char* type_key = j.contains("rope_type") ? "rope_type" : "type";
  if (!j.contains(type_key) || !j[type_key].is_string()) throw UserError(r.where() + ": " + what + " has no rope_type");
  s.type = j[type_key].get<std::string>();
  if (s.type != "default" && s.type != "linear" && s.type != "llama3") {
    throw UserError(r.where() + ": " + what + " type '" + s.type + "' is not supported; supported: default, linear, llama3");
  }
  refuse_partial_rotary(r, j, what + ".");
  s.factor = r.number(j, "factor", 1.0, true);
  s.low_freq_factor = r.number(j, "low_freq_factor", 1.0, true);
  s.high_freq_factor = r.number(j, "high_freq_factor", 4.0, true);
  if (j.contains("original_max_position_embeddings") && !j["original_max_position_embeddings"].is_null()) {
    const Json& v = j["original_max_position_embeddings"];
    if (!v.is_number_integer() || v.get<int64_t>() < 1) {
      throw UserError(r.where() + ": " + what + ".original_max_position_embeddings must be a positive integer");
    }
    s.original_max_position_embeddings = v.get<int64_t>();
  }
  if (s.type == "llama3" && s.high_freq_factor <= s.low_freq_factor) {
    throw UserError(r.where() + ": " + what + " high_freq_factor must exceed low_freq_factor");
  }
  return s;
}

bool same_scaling(const RopeScaling& a, const RopeScaling& b) {
  return a.type == b.type && a.factor == b.factor && (a.type != "llama3" || (a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor && a.original_max_position_embeddings == b.original_max_position_embeddings));
}

// Rotary settings in either spelling: transformers 4.x writes rope_theta + rope_scaling,
// 5.x writes rope_parameters {rope_theta, rope_type, ...} (docs/models.md "config.json").
// A folder that spells both is read only if they agree: silently preferring one would train
// a different model from the one the other spelling describes.
void parse_rope(const Reader& r, ModelConfig& c) {
  c.rope_theta = r.number("rope_theta", 10000.0, true);
  if (r.has("rope_scaling")) c.rope_scaling = parse_rope_object(r, r.json()["rope_scaling"], "rope_scaling");
  refuse_partial_rotary(r, r.json(), "");
  if (!r.has("rope_parameters")) return;
  const Json& p = r.json()["rope_parameters"];
  if (p.is_object()) {
    for (const auto& item : p.items()) {
      if (item.value().is_object()) {
        throw UserError(r.where() + ": rope_parameters per layer type ('" + item.key() +
                        "': {...}) is not supported; the families here use one rotary setting for every layer");
      }
    }
  }
  const RopeScaling scaling = parse_rope_object(r, p, "rope_parameters");
  const double theta = r.number(p, "rope_theta", r.has("rope_theta") ? c.rope_theta : 10000.0, true);
  if (r.has("rope_theta") && theta != c.rope_theta) {
    throw UserError(r.where() + ": rope_theta = " + r.json()["rope_theta"].dump() + " disagrees with rope_parameters.rope_theta = " +
                    p["rope_theta"].dump() + "; keep one of them");
  }
  if (r.has("rope_scaling") && !same_scaling(scaling, c.rope_scaling)) {
    throw UserError(r.where() + ": rope_scaling and rope_parameters describe different rotary scalings; keep one of them");
  }
  c.rope_theta = theta;
  c.rope_scaling = scaling;
}

// Qwen3-MoE's expert count: transformers 4.x writes num_experts, 5.x num_local_experts; a
// folder that spells both is read only if they agree.
int64_t expert_count(const Reader& r) {
  if (!r.has("num_local_experts")) return r.integer("num_experts", std::nullopt, 1, kMaxExperts);
  const int64_t local = r.integer("num_local_experts", std::nullopt, 1, kMaxExperts);
  if (r.has("num_experts") && r.integer("num_experts", std::nullopt, 1, kMaxExperts) != local) {
    throw UserError(r.where() + ": num_experts = " + r.json()["num_experts"].dump() + " disagrees with num_local_experts = " +
                    r.json()["num_local_experts"].dump() + "; keep one of them");
  }
  return local;
}

// Keys of transformers configs that change the math and that no family here implements:
// refused, so that a folder is never trained as a different model than it describes.
void refuse_unimplemented(const Reader& r, const ModelConfig& c) {
  if (r.has("layer_types")) {
    const Json& types = r.json()["layer_types"];
    if (!types.is_array() || static_cast<int64_t>(types.size()) != c.num_hidden_layers) {
      throw UserError(r.where() + ": layer_types must list one entry per layer (" + std::to_string(c.num_hidden_layers) + ")");
    }
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] != "full_attention") {
        throw UserError(r.where() + ": layer_types[" + std::to_string(i) + "] = " + excerpt(types[i].dump(), 40, false) +
                        " is not supported; every layer here is full_attention (sliding-window attention is not implemented)");
      }
    }
  }
  const double dropout = r.number("attention_dropout", 0.0, false);
  if (dropout != 0.0) {
    throw UserError(r.where() + ": attention_dropout = " + r.json()["attention_dropout"].dump() +
                    " is not supported (no dropout in attention); set it to 0.0");
  }
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

std::string ModelConfig::class_prefix() const {
  for (const auto& f : kFamilies) {
    if (model_type == f.model_type) return f.prefix;
  }
  return "Llama";
}

int64_t ModelConfig::parameter_count() const {
  const int64_t q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  int64_t attn = hidden_size * (q + 2 * kv) + q * hidden_size + 2 * hidden_size;  // + two layer norms
  if (attention_bias) attn += q + 2 * kv + (model_type == "llama" ? hidden_size : 0);
  if (qk_norm) attn += 2 * head_dim;
  int64_t total = vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2) + hidden_size;
  for (int64_t i = 0; i < num_hidden_layers; ++i) {
    const int64_t mlp = is_moe_layer(i) ? num_experts * 3 * hidden_size * moe_intermediate_size + hidden_size * num_experts
                                        : 3 * hidden_size * intermediate_size;
    total += attn + mlp;
  }
  return total;
}

namespace {

// Each size may be in bounds and their product still absurd (and overflow the counts below).
void check_plausible_size(const ModelConfig& c, const std::string& where) {
  const double hidden = static_cast<double>(c.hidden_size), layers = static_cast<double>(c.num_hidden_layers);
  const double attention = hidden * static_cast<double>(c.head_dim) * static_cast<double>(c.num_attention_heads + c.num_key_value_heads) * 2;
  const double mlp = c.num_experts > 0 ? static_cast<double>(c.num_experts) * 3 * hidden * static_cast<double>(c.moe_intermediate_size)
                                       : 3 * hidden * static_cast<double>(c.intermediate_size);
  const double total = 2 * static_cast<double>(c.vocab_size) * hidden + layers * (attention + mlp);
  if (total > kMaxParameters) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.3g", total);
    throw UserError(where + " describes a model of about " + std::string(text) +
                    " parameters; that is no model a job here can hold (check the sizes in it)");
  }
}

}  // namespace

ModelConfig parse_model_config(const std::string& json_text, const std::string& where) {
  const Json json = io::parse_user_json(json_text, where);
  if (!json.is_object()) throw UserError(where + " must hold a JSON object");
  Reader r(json, where);
  const Family& family = pick_family(r);
  ModelConfig c;
  c.architecture = family.architecture;
  c.model_type = family.model_type;
  c.vocab_size = r.integer("vocab_size", std::nullopt, 1);
  c.hidden_size = r.integer("hidden_size", std::nullopt, 1);
  c.intermediate_size = r.integer("intermediate_size", std::nullopt, 1);
  c.num_hidden_layers = r.integer("num_hidden_layers", std::nullopt, 1, kMaxCount);
  c.num_attention_heads = r.integer("num_attention_heads", std::nullopt, 1, kMaxCount);
  c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads, 1, kMaxCount);
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    throw UserError(where + ": num_attention_heads " + std::to_string(c.num_attention_heads) +
                    " must be a multiple of num_key_value_heads " + std::to_string(c.num_key_value_heads));
  }
  if (!r.has("head_dim") && c.hidden_size % c.num_attention_heads != 0) {
    throw UserError(where + ": hidden_size must be a multiple of num_attention_heads when head_dim is not given");
  }
  c.head_dim = r.integer("head_dim", c.hidden_size / c.num_attention_heads, 1);
  if (c.head_dim % 2 != 0) throw UserError(where + ": head_dim " + std::to_string(c.head_dim) + " must be even for rotary embeddings");
  c.max_position_embeddings = r.integer("max_position_embeddings", 2048, 1);
  parse_rope(r, c);
  c.rms_norm_eps = r.number("rms_norm_eps", 1e-6, true);
  c.initializer_range = r.number("initializer_range", 0.02, true);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);  // every family's HF default
  const std::string act = r.has("hidden_act") ? r.string("hidden_act") : "silu";
  if (act != "silu") throw UserError(where + ": hidden_act '" + act + "' is not supported; supported: silu");
  if (c.model_type == "llama") {
    c.attention_bias = r.boolean("attention_bias", false);
    c.mlp_bias = r.boolean("mlp_bias", false);
  } else if (c.model_type == "qwen2") {
    c.attention_bias = true;
  } else {
    c.attention_bias = r.boolean("attention_bias", false);
    c.qk_norm = true;
  }
  if (c.model_type != "llama" && r.boolean("use_sliding_window", false)) {
    throw UserError(where + ": use_sliding_window = true is not supported yet; set it to false");
  }
  if (c.model_type == "qwen3_moe") {
    c.num_experts = expert_count(r);
    c.num_experts_per_tok = r.integer("num_experts_per_tok", std::nullopt, 1, kMaxExperts);
    if (c.num_experts_per_tok > c.num_experts) {
      throw UserError(where + ": num_experts_per_tok " + std::to_string(c.num_experts_per_tok) + " exceeds num_experts " +
                      std::to_string(c.num_experts));
    }
    c.moe_intermediate_size = r.integer("moe_intermediate_size", std::nullopt, 1);
    c.decoder_sparse_step = r.integer("decoder_sparse_step", 1, 1);
    c.norm_topk_prob = r.boolean("norm_topk_prob", false);
    c.output_router_logits = r.boolean("output_router_logits", false);
    c.router_aux_loss_coef = r.number("router_aux_loss_coef", 0.001, false);
    if (r.has("mlp_only_layers")) {
      const Json& m = json["mlp_only_layers"];
      if (!m.is_array()) throw UserError(where + ": mlp_only_layers must be a list of layer indices");
      for (const auto& v : m) {
        if (!v.is_number_integer()) throw UserError(where + ": mlp_only_layers must be a list of layer indices");
        c.mlp_only_layers.push_back(v.get<int64_t>());
      }
    }
  }
  refuse_unimplemented(r, c);
  check_plausible_size(c, where);
  c.source_json = json_text;
  return c;
}

ModelConfig load_model_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  if (!std::filesystem::exists(path)) {
    throw UserError("cannot read " + path + "; a model folder needs config.json (or use a built-in flavour: qwen3-debug, ...)");
  }
  return parse_model_config(io::read_user_file(path, io::kMaxSmallJsonBytes, "config.json"), path);
}

std::string model_config_json(const ModelConfig& c, const std::string& torch_dtype) {
  Json j;
  if (!c.source_json.empty()) {
    j = Json::parse(c.source_json);
  } else {
    j["architectures"] = {c.architecture};
    j["attention_bias"] = c.attention_bias;
    j["attention_dropout"] = 0.0;
    j["bos_token_id"] = nullptr;
    j["eos_token_id"] = nullptr;
    j["head_dim"] = c.head_dim;
    j["hidden_act"] = "silu";
    j["hidden_size"] = c.hidden_size;
    j["initializer_range"] = c.initializer_range;
    j["intermediate_size"] = c.intermediate_size;
    j["max_position_embeddings"] = c.max_position_embeddings;
    if (c.model_type == "llama") j["mlp_bias"] = c.mlp_bias;
    j["model_type"] = c.model_type;
    if (c.model_type == "qwen3_moe") {
      j["decoder_sparse_step"] = c.decoder_sparse_step;
      j["mlp_only_layers"] = c.mlp_only_layers;
      j["moe_intermediate_size"] = c.moe_intermediate_size;
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["num_experts"] = c.num_experts;
      j["num_experts_per_tok"] = c.num_experts_per_tok;
      j["output_router_logits"] = c.output_router_logits;
      j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    }
    j["num_attention_heads"] = c.num_attention_heads;
    j["num_hidden_layers"] = c.num_hidden_layers;
    j["num_key_value_heads"] = c.num_key_value_heads;
    j["rms_norm_eps"] = c.rms_norm_eps;
    if (c.rope_scaling.type == "default") {
      j["rope_scaling"] = nullptr;
    } else {
      j["rope_scaling"] = {{"factor", c.rope_scaling.factor}, {"rope_type", c.rope_scaling.type}};
      if (c.rope_scaling.type == "llama3") {
        j["rope_scaling"]["high_freq_factor"] = c.rope_scaling.high_freq_factor;
        j["rope_scaling"]["low_freq_factor"] = c.rope_scaling.low_freq_factor;
        j["rope_scaling"]["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
      }
    }
    j["rope_theta"] = c.rope_theta;
    if (c.model_type != "llama") {
      j["sliding_window"] = nullptr;
      j["use_sliding_window"] = false;
    }
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["use_cache"] = true;
    j["vocab_size"] = c.vocab_size;
  }
  // The dtype in the spelling the folder used (transformers 5 writes dtype, 4.x torch_dtype).
  j[j.contains("dtype") ? "dtype" : "torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

// ---- built-in flavours ---------------------------------------------------------------------

std::vector<std::string> debug_flavour_names() {
  return {"llama-debug", "qwen2-debug", "qwen3-debug", "qwen3-moe-debug", "qwen3-moe-4d-debug"};
}

bool is_debug_flavour(const std::string& name) {
  const auto names = debug_flavour_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

ModelConfig debug_flavour_config(const std::string& name) {
  if (!is_debug_flavour(name)) {
    throw UserError("'" + name + "' is not a built-in model flavour; built-in: " + join_names(debug_flavour_names()));
  }
  if (name == "qwen3-moe-4d-debug") {
    // The flagship layout's debug model: heads and kv heads for tp 2 x Ulysses 2, 8 experts for ep.
    ModelConfig c = debug_flavour_config("qwen3-moe-debug");
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.head_dim = 16;
    return c;
  }
  ModelConfig c;
  const std::string family = name.substr(0, name.size() - std::string("-debug").size());
  for (const auto& f : kFamilies) {
    if (family == f.model_type || (family == "qwen3-moe" && std::string(f.model_type) == "qwen3_moe")) {
      c.architecture = f.architecture;
      c.model_type = f.model_type;
    }
  }
  c.vocab_size = 512;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.max_position_embeddings = 1024;
  c.initializer_range = 0.02;
  c.attention_bias = c.model_type == "qwen2";
  c.qk_norm = c.model_type == "qwen3" || c.model_type == "qwen3_moe";
  c.tie_word_embeddings = c.model_type == "qwen3";
  if (c.model_type == "qwen3_moe") {
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 64;
    c.norm_topk_prob = true;
    c.output_router_logits = true;
    c.router_aux_loss_coef = 0.01;
  }
  return c;
}

}  // namespace hyperparallel::models
