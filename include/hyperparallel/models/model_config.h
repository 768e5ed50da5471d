// ModelConfig: the architecture of a Hugging Face causal LM, read from config.json.
//
// One struct covers the four supported families (Llama, Qwen2, Qwen3, Qwen3-MoE): they share
// one decoder skeleton and differ in flags (q/k/v bias, q/k RMSNorm, rope scaling, sparse MoE
// layers). parse_model_config checks every key it uses (type and range, naming the key and
// the file) and rejects what the models cannot honour (another hidden_act, sliding windows)
// instead of silently computing something else. The text it was parsed from is kept so that
// save_pretrained writes config.json back with every key the user had.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hyperparallel::models {

struct RopeScaling {
  std::string type = "default";  // default | linear | llama3
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

struct ModelConfig {
  std::string architecture;  // LlamaForCausalLM | Qwen2ForCausalLM | Qwen3ForCausalLM | Qwen3MoeForCausalLM
  std::string model_type;    // llama | qwen2 | qwen3 | qwen3_moe
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 2048;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v (and o for Llama) biases; always on for Qwen2's q/k/v
  bool mlp_bias = false;        // Llama only
  bool qk_norm = false;         // Qwen3 family: RMSNorm on each head of q and k
  RopeScaling rope_scaling;
  // Sparse MoE (Qwen3-MoE); num_experts == 0 means dense.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  bool norm_topk_prob = false;
  bool output_router_logits = false;
  double router_aux_loss_coef = 0.001;

  std::string source_json;  // config.json as read; empty for a built-in flavour

  bool is_moe_layer(int64_t layer) const;
  // The HF class-name prefix of this family: Llama, Qwen2, Qwen3, Qwen3Moe.
  std::string class_prefix() const;
  int64_t parameter_count() const;  // with tied embeddings counted once
};

// `where` names the source in errors (e.g. "/models/x/config.json"). Throws UserError.
ModelConfig parse_model_config(const std::string& json_text, const std::string& where);
ModelConfig load_model_config(const std::string& dir);  // dir/config.json
// config.json text for `config`: its source with torch_dtype updated, or (for a built-in
// flavour) every key the architecture's HF config class writes.
std::string model_config_json(const ModelConfig& config, const std::string& torch_dtype = "float32");

// Built-in tiny flavours that need no files: llama-debug, qwen2-debug, qwen3-debug,
// qwen3-moe-debug, qwen3-moe-4d-debug (8 heads / 4 kv heads of 16: the flagship layout's).
// Returns false for other names.
bool is_debug_flavour(const std::string& name);
ModelConfig debug_flavour_config(const std::string& name);  // UserError listing the flavours
std::vector<std::string> debug_flavour_names();

}  // namespace hyperparallel::models
