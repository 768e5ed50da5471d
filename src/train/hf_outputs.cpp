// HF Trainer / LlamaFactory output files. See hf_outputs.h.
#include "hf_outputs.h"

#include <cmath>
#include <filesystem>

#include "hyperparallel/io/user_files.h"
#include "hyperparallel/platform/user_error.h"
#include "train_output.h"

namespace hyperparallel::train {
namespace {

nlohmann::json log_entry(const nlohmann::json& line) {
  nlohmann::json entry = nlohmann::json::object();
  for (const auto& [ours, theirs] : std::vector<std::pair<const char*, const char*>>{
           {"loss", "loss"}, {"grad_norm", "grad_norm"}, {"lr", "learning_rate"}, {"epoch", "epoch"}, {"step", "step"},
           {"eval_loss", "eval_loss"}, {"eval_runtime", "eval_runtime"}, {"eval_samples_per_second", "eval_samples_per_second"}}) {
    if (line.contains(ours)) entry[theirs] = line[ours];
  }
  return entry;
}

nlohmann::json train_metrics_json(const TrainMetrics& m) {
  const double runtime = std::max(m.train_runtime_s, 1e-9);
  return {{"epoch", m.epoch},
          {"total_flos", m.total_flos},
          {"train_loss", m.train_loss},
          {"train_runtime", m.train_runtime_s},
          {"train_samples_per_second", static_cast<double>(m.samples) / runtime},
          {"train_steps_per_second", static_cast<double>(m.global_step) / runtime}};
}

}  // namespace

void write_hf_trainer_files(const std::string& output_dir, const TrainConfig& c, const std::vector<nlohmann::json>& log_lines,
                            const TrainMetrics& m) {
  nlohmann::json history = nlohmann::json::array();
  for (const auto& line : log_lines) history.push_back(log_entry(line));
  const nlohmann::json train = train_metrics_json(m);
  nlohmann::json last = train;
  last["step"] = m.global_step;
  history.push_back(last);
  const nlohmann::json state = {{"best_global_step", nullptr},
                                {"best_metric", nullptr},
                                {"best_model_checkpoint", nullptr},
                                {"epoch", m.epoch},
                                {"eval_steps", nullptr},
                                {"global_step", m.global_step},
                                {"is_hyper_param_search", false},
                                {"is_local_process_zero", true},
                                {"is_world_process_zero", true},
                                {"log_history", history},
                                {"logging_steps", c.logging_steps},
                                {"max_steps", m.max_steps},
                                {"num_input_tokens_seen", m.input_tokens},
                                {"num_train_epochs", c.num_train_epochs},
                                {"save_steps", c.save_steps},
                                {"total_flos", m.total_flos},
                                {"train_batch_size", c.per_device_train_batch_size},
                                {"trial_name", nullptr},
                                {"trial_params", nullptr}};
  write_json_file(output_dir + "/trainer_state.json", state);
  write_json_file(output_dir + "/train_results.json", train);
  nlohmann::json all = train;
  if (m.eval_loss) {
    nlohmann::json eval = {{"epoch", m.epoch}, {"eval_loss", *m.eval_loss}};
    if (m.perplexity) eval["eval_perplexity"] = std::exp(*m.eval_loss);
    write_json_file(output_dir + "/eval_results.json", eval);
    all.update(eval);
  }
  write_json_file(output_dir + "/all_results.json", all);
}

void write_generation_config(const std::string& model_dir, const std::string& source_dir, const data::Tokenizer& tokenizer) {
  namespace fs = std::filesystem;
  const fs::path source = fs::path(source_dir) / "generation_config.json";
  if (!source_dir.empty() && fs::is_regular_file(source)) {
    // Read through the bounded reader (it is the user's file), written back as it was.
    write_json_file(model_dir + "/generation_config.json", io::read_user_json(source.string(), io::kMaxSmallJsonBytes, "generation_config.json"));
    return;
  }
  nlohmann::json config = {{"_from_model_config", true}};
  const data::SpecialTokens& special = tokenizer.special_tokens();
  for (const auto& [key, token] : std::vector<std::pair<const char*, std::string>>{
           {"bos_token_id", special.bos}, {"eos_token_id", special.eos}, {"pad_token_id", special.pad}}) {
    if (token.empty()) continue;
    if (const auto id = tokenizer.token_to_id(token)) config[key] = *id;
  }
  write_json_file(model_dir + "/generation_config.json", config);
}

void add_missing_chat_template(const std::string& model_dir, const data::ChatTemplate& chat_template) {
  namespace fs = std::filesystem;
  const std::string path = model_dir + "/tokenizer_config.json";
  nlohmann::json config = nlohmann::json::object();
  if (fs::exists(path)) config = io::read_user_json(path, io::kMaxSmallJsonBytes, "tokenizer_config.json");
  if (!config.is_object()) throw UserError(path + " is not a JSON object");
  if (config.contains("chat_template") && !config["chat_template"].is_null()) return;
  config["chat_template"] = chat_template.jinja();
  write_json_file(path, config);
}

}  // namespace hyperparallel::train
