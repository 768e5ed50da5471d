// AutoModelForCausalLM: build a CausalLM from a Hugging Face folder or a built-in flavour
// name, load weights into it (sharded or not), and save it as transformers does.
//
// from_pretrained(dir) reads config.json (architectures / model_type picks the family),
// builds the model with deferred initialisation (no random init is wasted), applies
// plan_overrides, and loads model.safetensors or the sharded index. With deferred_init the
// weights are not loaded: apply fully_shard first, then load_pretrained_weights(), and each
// rank reads only its own rows of every tensor, so no rank ever holds the whole model.
// A built-in flavour name (qwen3-debug, ...) builds a randomly initialised tiny model from
// `seed` with no files. Names, shapes and dtypes are checked against the config before any
// tensor is read; every mismatch names the file, the tensor and both shapes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hyperparallel/models/causal_lm.h"
#include "hyperparallel/models/plan_overrides.h"

namespace hyperparallel::models {

struct ModelLoadOptions {
  at::ScalarType dtype = at::kFloat;  // parameter dtype (fully_shard needs fp32 masters)
  std::string device = "cpu";         // this build computes on the CPU
  bool deferred_init = false;         // build without weights; load later (after fully_shard)
  uint64_t seed = 0;                  // initialisation of built-in flavours and from_config
  std::vector<PlanOverride> plan_overrides;
  std::shared_ptr<const ReplacementRegistry> replacements;  // null: the built-in registry
  // Crop to the first N decoder layers (HyperParallel's model.num_hidden_layers): the config's
  // count replaced; load the folder's weights with cropped = true. UserError above the count.
  std::optional<int64_t> num_hidden_layers;
};

class AutoModelForCausalLM {
 public:
  static std::shared_ptr<CausalLM> from_pretrained(const std::string& name_or_dir, const ModelLoadOptions& options = {});
  // A randomly initialised model (HF's init, seeded), or a deferred one.
  static std::shared_ptr<CausalLM> from_config(const ModelConfig& config, const ModelLoadOptions& options = {});
};

// Loads dir's weights into `model` (sharded by fully_shard or not; every rank calls it).
// `cropped`: the model keeps fewer layers than the folder (ModelLoadOptions::num_hidden_layers);
// the folder's later layers are skipped instead of being an error.
void load_pretrained_weights(CausalLM& model, const std::string& dir, bool cropped = false);

struct SaveOptions {
  std::string max_shard_size = "5GB";  // transformers' default
  std::optional<at::ScalarType> dtype;  // default: the parameters' dtype
};
// Writes config.json and the weights into `dir` as save_pretrained does. With fully_shard it
// is collective (every rank calls; rank 0 gathers and writes). Returns the files written
// (empty on ranks that do not write).
std::vector<std::string> save_pretrained(CausalLM& model, const std::string& dir, const SaveOptions& options = {});
// The same from every parameter of a `config` model, whole, gathered by the caller (e.g. from
// pipeline stages); not collective. UserError when one is missing.
std::vector<std::string> save_pretrained(const ModelConfig& config, const std::map<std::string, at::Tensor>& parameters,
                                         const std::string& dir, const SaveOptions& options = {});

}  // namespace hyperparallel::models
