// The ~48 M-parameter Qwen3 that the model and tensor-parallel benchmarks share: vocab 32768,
// hidden 512, 10 layers, 8 heads of 64, 4 kv heads, intermediate 1536.
#pragma once

#include "hyperparallel/models/model_config.h"

namespace hyperparallel::benchmarks {

inline models::ModelConfig qwen3_48m_config() {
  models::ModelConfig c = models::debug_flavour_config("qwen3-debug");
  c.vocab_size = 32768;
  c.hidden_size = 512;
  c.num_hidden_layers = 10;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  c.intermediate_size = 1536;
  return c;
}

}  // namespace hyperparallel::benchmarks
