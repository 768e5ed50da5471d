// The files Hugging Face's Trainer and LlamaFactory leave in output_dir, written the same way
// so their tools (LlamaFactory's plot_loss, dashboards that read trainer_state.json, scripts
// that read train_results.json) work on a run here:
//   trainer_state.json   TrainerState: global_step, max_steps, epoch, num_train_epochs,
//                        logging/save steps, train_batch_size, total_flos,
//                        num_input_tokens_seen and log_history — one entry per logged step
//                        ({loss, grad_norm, learning_rate, epoch, step}) and the final train
//                        metrics entry, as Trainer.train() appends them;
//   eval_results.json    with an evaluation after the last step: epoch, eval_loss (and
//                        eval_perplexity for stage pt), also merged into all_results.json;
//   train_results.json   the train metrics (epoch, total_flos, train_loss, train_runtime,
//   all_results.json     train_samples_per_second, train_steps_per_second), as
//                        trainer.save_metrics("train", ...) writes them;
//   generation_config.json  next to the exported model: the source model's own when it has
//                        one, else bos/eos/pad token ids from the tokenizer (what
//                        GenerationConfig.from_model_config writes).
// An exported tokenizer_config.json without a chat_template gets the one the run trained with
// (ChatTemplate::jinja), as LlamaFactory fills it in; a model's own template is kept.
// total_flos follows HF's estimate, 6 x parameters x input tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hyperparallel/data/chat_template.h"
#include "hyperparallel/data/tokenizer.h"
#include "hyperparallel/train/train_config.h"

namespace hyperparallel::train {

struct TrainMetrics {
  int64_t global_step = 0;
  int64_t max_steps = 0;
  double epoch = 0;
  double train_loss = 0;        // mean step loss of this run's steps
  double train_runtime_s = 0;
  int64_t samples = 0;          // rows trained by this run
  int64_t input_tokens = 0;     // tokens seen, this run and the runs it resumes
  double total_flos = 0;
  int64_t global_batch_rows = 0;
  std::optional<double> eval_loss;  // the evaluation after the last step, when there was one
  bool perplexity = false;          // stage pt: eval_perplexity = exp(eval_loss), as LlamaFactory reports
};

// `log_lines` are trainer_log.jsonl's lines (ours: step, loss, grad_norm, lr, epoch, ...).
void write_hf_trainer_files(const std::string& output_dir, const TrainConfig& config, const std::vector<nlohmann::json>& log_lines,
                            const TrainMetrics& metrics);

// generation_config.json into `model_dir` (see above); `source_dir` "" when the model is a
// built-in flavour.
void write_generation_config(const std::string& model_dir, const std::string& source_dir, const data::Tokenizer& tokenizer);

// model_dir/tokenizer_config.json gets `chat_template`'s Jinja unless it has a template.
void add_missing_chat_template(const std::string& model_dir, const data::ChatTemplate& chat_template);

}  // namespace hyperparallel::train
