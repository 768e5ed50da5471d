// Building, loading and saving HF causal LMs. See models/auto_model.h.
#include "hyperparallel/models/auto_model.h"


#include <algorithm>
#include <filesystem>
#include <set>

#include "hyperparallel/dtensor/parameter_specs.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/io/hf_checkpoint.h"
#include "hyperparallel/platform/suggest.h"
#include "hyperparallel/platform/user_error.h"
#include "decoder.h"
#include "io/atomic_write.h"

namespace hyperparallel::models {
namespace fs = std::filesystem;

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Keys a checkpoint may carry that the model rightly has no parameter for.
bool ignorable_key(const std::string& name, const CausalLM& model) {
  if (name == "lm_head.weight" && model.tied()) return true;  // some tied checkpoints store the head
  return name.size() >= 19 && name.compare(name.size() - 19, 19, "rotary_emb.inv_freq") == 0;
}

std::string dtype_json_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: throw UserError(std::string("cannot save a model in dtype ") + c10::toString(dtype));
  }
}

}  // namespace

std::shared_ptr<CausalLM> AutoModelForCausalLM::from_config(const ModelConfig& given, const ModelLoadOptions& options) {
  ModelConfig config = given;
  if (options.num_hidden_layers) {
    if (*options.num_hidden_layers < 1 || *options.num_hidden_layers > given.num_hidden_layers) {
      throw UserError("model.num_hidden_layers " + std::to_string(*options.num_hidden_layers) + " must be between 1 and the model's " +
                      std::to_string(given.num_hidden_layers) + " layers (it keeps the first N)");
    }
    config.num_hidden_layers = *options.num_hidden_layers;
  }
  if (options.device != "cpu") {
    throw UserError("device '" + options.device + "' is not available: this build computes on the CPU (device: cpu)");
  }
  if (options.dtype != at::kFloat && options.dtype != at::kBFloat16 && options.dtype != at::kHalf) {
    throw UserError(std::string("model dtype ") + c10::toString(options.dtype) + " is not one of float32, bfloat16, float16");
  }
  auto model = std::make_shared<CausalLM>(config, options.deferred_init, options.seed, options.dtype);
  if (!options.plan_overrides.empty()) {
    const ReplacementRegistry builtins = ReplacementRegistry::with_builtins();
    apply_plan_overrides(*model, config, options.plan_overrides, options.replacements ? *options.replacements : builtins);
  }
  return model;
}

std::shared_ptr<CausalLM> AutoModelForCausalLM::from_pretrained(const std::string& name_or_dir, const ModelLoadOptions& options) {
  if (is_debug_flavour(name_or_dir) && !fs::exists(name_or_dir)) return from_config(debug_flavour_config(name_or_dir), options);
  if (!fs::is_directory(name_or_dir)) {
    throw UserError("model '" + name_or_dir + "' is neither a folder nor a built-in flavour (" + join_names(debug_flavour_names()) + ")");
  }
  ModelLoadOptions deferred = options;
  deferred.deferred_init = true;
  auto model = from_config(load_model_config(name_or_dir), deferred);
  if (!options.deferred_init) load_pretrained_weights(*model, name_or_dir, options.num_hidden_layers.has_value());
  return model;
}

namespace {

// A weight of decoder layer `layers` or later (a cropped model does not hold them).
bool beyond_layers(const std::string& name, int64_t layers) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return false;
  const size_t end = name.find('.', prefix.size());
  const std::string index = name.substr(prefix.size(), end == std::string::npos ? std::string::npos : end - prefix.size());
  if (index.empty() || index.size() > 9 || !std::all_of(index.begin(), index.end(), ::isdigit)) return false;
  return std::stoll(index) >= layers;
}

}  // namespace

void load_pretrained_weights(CausalLM& model, const std::string& dir, bool cropped) {
  io::HfCheckpoint checkpoint(dir);
  const auto shapes = fsdp::full_parameter_shapes(model);
  std::string missing, unexpected;
  for (const auto& [name, shape] : shapes) {
    if (!checkpoint.contains(name)) missing += (missing.empty() ? "" : ", ") + name;
  }
  // A pipeline stage holds part of the model: the other stages' tensors are no surprise.
  for (const auto& name : checkpoint.names()) {
    if (cropped && beyond_layers(name, model.config().num_hidden_layers)) continue;
    if (model.backbone().holds_all() && !shapes.count(name) && !ignorable_key(name, model)) unexpected += (unexpected.empty() ? "" : ", ") + name;
  }
  if (!missing.empty() || !unexpected.empty()) {
    throw UserError("weights in " + dir + " do not match the " + model.config().architecture + " config: missing [" + missing +
                    "], unexpected [" + unexpected + "]");
  }
  for (const auto& [name, shape] : shapes) {
    const io::SafetensorsEntry& e = checkpoint.entry(name);
    if (e.shape != shape) {
      throw UserError("weights in " + dir + ": tensor '" + name + "' has shape " + shape_text(e.shape) +
                      ", the config gives " + shape_text(shape));
    }
    if (!at::isFloatingType(e.dtype)) {
      throw UserError("weights in " + dir + ": tensor '" + name + "' is " + e.dtype_name + ", a parameter must be floating point");
    }
  }
  fsdp::load_parameters(model, [&](const std::string& name, const dtensor::Box& box) {
    return checkpoint.read_box(name, box.offsets, box.lengths);
  });
}

namespace {

std::vector<std::string> write_pretrained(const ModelConfig& config, const std::vector<std::string>& names,
                                          const std::map<std::string, at::Tensor>& full, at::ScalarType dtype, const std::string& dir,
                                          const SaveOptions& options) {
  const uint64_t max_shard = io::parse_byte_size(options.max_shard_size);
  std::vector<std::pair<std::string, at::Tensor>> ordered;  // named_parameters order, as HF's state_dict
  for (const auto& name : names) {
    const auto it = full.find(name);
    if (it == full.end()) throw UserError("save_pretrained: no tensor for parameter " + name + " of the " + config.architecture);
    ordered.emplace_back(name, it->second.to(dtype));
  }
  fs::create_directories(dir);
  io::write_file_atomically((fs::path(dir) / "config.json").string(), model_config_json(config, dtype_json_name(dtype)));
  auto files = io::save_hf_checkpoint(dir, ordered, max_shard);
  files.insert(files.begin(), "config.json");
  return files;
}

}  // namespace

std::vector<std::string> save_pretrained(CausalLM& model, const std::string& dir, const SaveOptions& options) {
  auto full = fsdp::full_state_dict(model, /*rank0_only=*/true);
  if (full.empty()) return {};
  at::ScalarType dtype = at::kFloat;
  const auto params = model.named_parameters();
  const auto names = dtensor::full_parameter_names(model);  // with experts other ranks hold
  for (const auto& name : names) {
    if (const at::Tensor* local = params.find(name)) dtype = options.dtype.value_or(local->scalar_type());
  }
  return write_pretrained(model.config(), names, full, dtype, dir, options);
}

std::vector<std::string> save_pretrained(const ModelConfig& config, const std::map<std::string, at::Tensor>& parameters,
                                         const std::string& dir, const SaveOptions& options) {
  ModelLoadOptions deferred;
  deferred.deferred_init = true;
  const auto layout = AutoModelForCausalLM::from_config(config, deferred);  // names in order, nothing written
  std::vector<std::string> names;
  for (const auto& item : layout->named_parameters()) names.push_back(item.key());
  const at::ScalarType dtype = options.dtype.value_or(parameters.empty() ? at::kFloat : parameters.begin()->second.scalar_type());
  return write_pretrained(config, names, parameters, dtype, dir, options);
}

}  // namespace hyperparallel::models
