// hyperparallel export: a training checkpoint to a Hugging Face model folder.
//   hyperparallel export CHECKPOINT OUT_DIR [--dtype float32|bfloat16] [--overwrite]
// Builds the model from the checkpoint's config.json, reads every rank's shards into it (any
// layout), and writes config.json, model.safetensors (+ index when large) and the tokenizer
// files, as save_pretrained does: transformers' from_pretrained loads the folder.
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "hyperparallel/data/tokenizer.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/models/causal_lm.h"
#include "hyperparallel/models/model_config.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/train/checkpoint.h"

namespace hyperparallel::cli {

int export_command(const Args& args) {
  constexpr const char* kUsage = "usage: export CHECKPOINT OUT_DIR [--dtype float32|bfloat16] [--overwrite]";
  std::vector<std::string> positional;
  std::string dtype = "float32";
  bool overwrite = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (take_option(args, i, "--dtype", dtype)) continue;
    if (args[i] == "--overwrite") {
      overwrite = true;
    } else if (args[i].rfind("--", 0) == 0) {
      throw UserError("unknown option '" + args[i] + "'; " + kUsage);
    } else {
      positional.push_back(args[i]);
    }
  }
  if (positional.size() != 2) throw UserError(std::string("needs a checkpoint folder and an output folder; ") + kUsage);
  if (dtype != "float32" && dtype != "bfloat16") throw UserError("--dtype '" + dtype + "' is not allowed; use float32 or bfloat16");
  const std::string checkpoint = train::resolve_checkpoint(positional[0], "");
  const std::string& out = positional[1];
  namespace fs = std::filesystem;
  if (fs::exists(out) && !fs::is_empty(out) && !overwrite) {
    throw UserError("OUT_DIR " + out + " is not empty; pick another folder or pass --overwrite");
  }
  if (!fs::exists(fs::path(checkpoint) / "config.json")) throw UserError("checkpoint " + checkpoint + " has no config.json");

  models::ModelLoadOptions options;
  options.deferred_init = true;  // every value comes from the checkpoint
  auto model = models::AutoModelForCausalLM::from_config(models::load_model_config(checkpoint), options);
  const train::CheckpointInfo info = train::load_checkpoint(checkpoint, *model, nullptr, 0);
  fs::create_directories(out);
  models::SaveOptions save;
  if (dtype == "bfloat16") save.dtype = at::kBFloat16;
  auto files = models::save_pretrained(*model, out, save);
  for (const auto& f : data::copy_tokenizer_files(checkpoint, out)) files.push_back(f);
  std::cout << "exported step " << info.step << " of " << info.model << " (" << info.world_size << " rank shards) to " << out << ":";
  for (const auto& f : files) std::cout << " " << fs::path(f).filename().string();
  std::cout << "\n";
  return 0;
}

}  // namespace hyperparallel::cli
