// hyperparallel generate: answer a prompt with a Hugging Face model folder (e.g. the one
// `train` or `export` wrote).
//   hyperparallel generate --model DIR --prompt TEXT [--template NAME] [--system TEXT]
//                          [--max-new-tokens N] [--temperature T] [--seed S] [--thinking]
// The prompt is rendered as one user turn by the chat template (default: the model family's,
// qwen3 / qwen / llama3 / llama2) with the assistant opening, decoded with a KV cache until an
// end-of-turn token, and the answer is printed. Temperature 0 (the default) is greedy.
// --max-new-tokens defaults to 128 (fewer when the model's context leaves less room); a prompt
// or a request that does not fit the context (max_position_embeddings) is a one-line error.
#include <algorithm>
#include <iostream>

#include "commands.h"
#include "hyperparallel/data/chat_template.h"
#include "hyperparallel/data/tokenizer.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/models/causal_lm.h"
#include "hyperparallel/models/generation.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::cli {
namespace {

std::string family_template(const models::ModelConfig& config, const data::Tokenizer& tokenizer) {
  if (config.model_type == "qwen3" || config.model_type == "qwen3_moe") return "qwen3";
  if (config.model_type == "qwen2") return "qwen";
  if (config.model_type == "llama") return tokenizer.token_to_id("<|start_header_id|>") ? "llama3" : "llama2";
  throw UserError("no default chat template for model_type " + config.model_type + "; pass --template");
}

double parse_temperature(const std::string& text) {
  size_t used = 0;
  double t = -1;
  try {
    t = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(t >= 0 && t <= 100)) throw UserError("--temperature '" + text + "' is not a number in [0, 100]");
  return t;
}

}  // namespace

int generate_command(const Args& args) {
  constexpr const char* kUsage =
      "usage: generate --model DIR --prompt TEXT [--template NAME] [--system TEXT] [--max-new-tokens N] [--temperature T] "
      "[--seed S] [--thinking]";
  std::string model_dir, prompt, template_name, system, v;
  int max_new_tokens = -1, seed = 0;  // -1: up to 128, as the context allows
  double temperature = 0;
  bool thinking = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (take_option(args, i, "--model", model_dir) || take_option(args, i, "--prompt", prompt) ||
        take_option(args, i, "--template", template_name) || take_option(args, i, "--system", system)) {
      continue;
    }
    if (take_option(args, i, "--max-new-tokens", v)) {
      max_new_tokens = parse_int_option("--max-new-tokens", v, 1);
    } else if (take_option(args, i, "--temperature", v)) {
      temperature = parse_temperature(v);
    } else if (take_option(args, i, "--seed", v)) {
      seed = parse_int_option("--seed", v, 0);
    } else if (args[i] == "--thinking") {
      thinking = true;
    } else {
      throw UserError("unknown option '" + args[i] + "'; " + kUsage);
    }
  }
  if (model_dir.empty() || prompt.empty()) throw UserError(std::string("--model and --prompt are required; ") + kUsage);

  const auto tokenizer = data::Tokenizer::from_file(model_dir);
  auto model = models::AutoModelForCausalLM::from_pretrained(model_dir);
  if (template_name.empty()) template_name = family_template(model->config(), tokenizer);
  const auto chat_template = data::ChatTemplate::named(template_name, tokenizer.special_tokens().eos);
  std::vector<data::ChatMessage> messages;
  if (!system.empty()) messages.push_back({"system", system});
  messages.push_back({"user", prompt});
  data::ChatRenderOptions render;
  render.add_generation_prompt = true;
  render.enable_thinking = thinking;

  const std::vector<int64_t> ids = tokenizer.encode(chat_template.render(messages, render));
  models::GenerationOptions options;
  const int64_t room = model->config().max_position_embeddings - static_cast<int64_t>(ids.size());
  options.max_new_tokens = max_new_tokens > 0 ? max_new_tokens : std::max<int64_t>(1, std::min<int64_t>(128, room));
  options.temperature = temperature;
  options.seed = static_cast<uint64_t>(seed);
  options.stop_ids = tokenizer.end_of_turn_ids();
  const auto answer = models::generate(*model, {ids}, options);
  std::cout << tokenizer.decode(answer[0], true) << "\n";
  return 0;
}

}  // namespace hyperparallel::cli
