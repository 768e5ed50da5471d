// hyperparallel train-tokenizer: learn a small byte-level BPE tokenizer.json from datasets
// rendered by a chat template (data/bpe_trainer.h).
#include <iostream>

#include "commands.h"
#include "hyperparallel/data/bpe_trainer.h"
#include "hyperparallel/data/chat_template.h"
#include "hyperparallel/data/dataset_registry.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::cli {

int train_tokenizer_command(const Args& args) {
  std::string dataset, dataset_dir = "data", template_name = "qwen3", out;
  data::BpeTrainerOptions options;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string v;
    if (take_option(args, i, "--dataset", v)) {
      dataset = v;
    } else if (take_option(args, i, "--dataset-dir", v)) {
      dataset_dir = v;
    } else if (take_option(args, i, "--template", v)) {
      template_name = v;
    } else if (take_option(args, i, "--vocab-size", v)) {
      options.vocab_size = parse_int_option("--vocab-size", v, 1);
    } else if (take_option(args, i, "--out", v)) {
      out = v;
    } else {
      throw UserError("unknown argument " + args[i] +
                      "; usage: hyperparallel train-tokenizer --dataset NAMES --out DIR [--dataset-dir D] [--template T] [--vocab-size N]");
    }
  }
  if (dataset.empty() || out.empty()) throw UserError("--dataset and --out are required");
  const auto conversations = data::load_datasets(dataset, dataset_dir);
  const auto chat_template = data::ChatTemplate::named(template_name, options.eos_token);
  std::vector<std::string> texts;
  for (const auto& c : conversations) texts.push_back(chat_template.render(c.messages));
  data::train_and_save_tokenizer(texts, out, options);
  std::cout << "wrote " << out << "/tokenizer.json and tokenizer_config.json (" << texts.size() << " conversations)\n";
  return 0;
}

}  // namespace hyperparallel::cli
