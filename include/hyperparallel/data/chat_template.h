// ChatTemplate: conversations rendered as the models' own chat templates render them.
//
// A registry by name, like LlamaFactory's `template:` key. Each template is the model's
// tokenizer_config.json chat_template transcribed to C++ (no Jinja engine: nothing from a
// model folder is executed), so render() returns exactly the text transformers'
// apply_chat_template returns, and Tokenizer::encode of it gives its token ids (special
// markers such as <|im_start|> are added tokens and match whole).
//   qwen3   Qwen3's template: an empty <think></think> block on assistant turns after the
//           last user query, reasoning split out of "<think>...</think>" content,
//           enable_thinking = false adds the empty block to the generation prompt
//   qwen    ChatML (<|im_start|>role\ncontent<|im_end|>\n) with LlamaFactory's default system
//           prompt "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
//   qwen3_nothink  ChatML without a default system prompt or think blocks (LlamaFactory's
//           template for Qwen3 instruct models that do not reason)
//   llama3  Llama 3: <|begin_of_text|>, <|start_header_id|>role<|end_header_id|>\n\n,
//           trimmed content, <|eot_id|>; the assistant header only with add_generation_prompt
//           (Meta's template; the fixture's copy appends it unconditionally)
//   llama2  Llama 2: <s>[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] assistant </s>
//   default LlamaFactory's plain-text template for models without one:
//           "System: s<eos>\nHuman: u<eos>\nAssistant:a<eos>\n" (needs the tokenizer's eos token)
// Roles: system (first message only), user, assistant; anything else is a UserError.
// A conversation without a system message (or with an empty one) gets the template's default
// system prompt, as LlamaFactory renders it; with_default_system() replaces it (LlamaFactory's
// `default_system` key), "" turns it off.
//
// render_with_spans() also returns where each assistant response lies in the text: from the
// end of the assistant header to the end of the turn's end marker (<|im_end|>, <|eot_id|>,
// </s>, eos), qwen3's think block included. Those are the tokens an SFT sample trains on; the
// spans come from the same render as the text, so turns rendered differently in history (qwen3
// drops reasoning there) are labelled exactly as the model will see them.
#pragma once

#include <string>
#include <vector>

namespace hyperparallel::data {

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

struct ChatRenderOptions {
  bool add_generation_prompt = false;  // end with the opening of an assistant turn
  bool enable_thinking = true;         // qwen3: false adds an empty think block to the prompt
};

// A byte range [begin, end) of a rendered text.
struct TextSpan {
  size_t begin = 0;
  size_t end = 0;
};

struct RenderedChat {
  std::string text;
  std::vector<TextSpan> responses;  // one per assistant message, in order
};

class ChatTemplate {
 public:
  // UserError listing the names; `eos_token` is required by `default` only.
  static ChatTemplate named(const std::string& name, const std::string& eos_token = "");
  static std::vector<std::string> names();
  const std::string& name() const { return name_; }
  const std::string& default_system() const { return default_system_; }
  ChatTemplate with_default_system(std::string system) const;
  std::string render(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options = {}) const;
  RenderedChat render_with_spans(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options = {}) const;
  // The same template as Jinja for tokenizer_config.json's chat_template (with its default
  // system prompt), so transformers' apply_chat_template renders what render() does (qwen3:
  // Qwen3's own template); an exported model without a chat template gets this one.
  std::string jinja() const;

 private:
  ChatTemplate(std::string name, std::string eos_token, std::string default_system)
      : name_(std::move(name)), eos_token_(std::move(eos_token)), default_system_(std::move(default_system)) {}
  std::string name_;
  std::string eos_token_;
  std::string default_system_;
};

}  // namespace hyperparallel::data
