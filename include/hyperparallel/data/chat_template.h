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
// Roles: system (first message only), user, assistant, and for tool conversations function
// (the assistant calling tools) and observation (what they returned); anything else is a
// UserError.
// A conversation without a system message (or with an empty one) gets the template's default
// system prompt, as LlamaFactory renders it; with_default_system() replaces it (LlamaFactory's
// `default_system` key), "" turns it off.
//
// render_with_spans() also returns where each assistant response (and function call) lies in
// the text: from the end of the assistant header to the end of the turn's end marker
// (<|im_end|>, <|eot_id|>, </s>, eos), qwen3's think block included. Those are the tokens an SFT sample trains on; the
// spans come from the same render as the text, so turns rendered differently in history (qwen3
// drops reasoning there) are labelled exactly as the model will see them.
//
// Tool calls (docs/data.md "Tool calls"; the formats are data/tool_calls.h), rendered as
// LlamaFactory's templates render them, slot by slot (its template.py):
//   - ChatRenderOptions::tools (the conversation's tool list, JSON text) is appended to the
//     system prompt in the template's tool format — after the default system prompt when the
//     conversation has none — and a non-empty value opens a system block even without one;
//   - a function turn is an assistant turn whose text is the tool format's function call;
//     observations are prompt: qwen, qwen3, qwen3_nothink
//     "<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n", llama3
//     "<|start_header_id|>ipython<|end_header_id|>\n\n{content}<|eot_id|>", default as a user turn;
//   - each template's own tool format: qwen for qwen / qwen3 / qwen3_nothink, llama3, default;
//     with_tool_format() replaces it as LlamaFactory's tool_format key does, and then, as
//     there, function calls end with the eos token alone (the template's stop word: no "\n"
//     after <|im_end|>, none after default's eos); llama2 renders no tool calls (its turns
//     here are Meta's, not LlamaFactory's);
//   - llama3's tool prompt has a "Today Date:" line: LlamaFactory writes the day it runs;
//     here it is today_tool_date() when the template is made, and with_tool_date() fixes it;
//   - what stays this library's: llama3 trims user / assistant / plain system content as
//     Meta's template does (LlamaFactory does not; the same text whenever content has no
//     surrounding whitespace), while the system text with tools, function calls and
//     observations are written untrimmed, as LlamaFactory writes them; qwen3 places think
//     blocks by Qwen3's rules (after the last user query; observations are not queries), where
//     LlamaFactory's qwen3 prefixes an empty one to every response, function calls included.
// jinja() exports the same tool rendering for every template but qwen3 and llama2 (see jinja()).
#pragma once

#include <string>
#include <vector>

namespace hyperparallel::data {

struct ChatMessage {
  std::string role;  // system | user | assistant | function | observation
  std::string content;
};

struct ChatRenderOptions {
  bool add_generation_prompt = false;  // end with the opening of an assistant turn
  bool enable_thinking = true;         // qwen3: false adds an empty think block to the prompt
  // The conversation's tool descriptions, as transformers' apply_chat_template(tools=...) and
  // LlamaFactory's `tools` column take them: the JSON text of a list; "" for none.
  std::string tools = {};
};

// A byte range [begin, end) of a rendered text.
struct TextSpan {
  size_t begin = 0;
  size_t end = 0;
};

struct RenderedChat {
  std::string text;
  std::vector<TextSpan> responses;  // one per assistant or function message, in order
};

class ChatTemplate {
 public:
  // UserError listing the names; `eos_token` is required by `default` only.
  static ChatTemplate named(const std::string& name, const std::string& eos_token = "");
  static std::vector<std::string> names();
  const std::string& name() const { return name_; }
  const std::string& default_system() const { return default_system_; }
  ChatTemplate with_default_system(std::string system) const;
  // The tool format (data/tool_calls.h): the template's own, or the one with_tool_format()
  // set; "" for llama2, which renders no tool calls.
  const std::string& tool_format() const { return tool_format_; }
  // LlamaFactory's `tool_format` key: UserError for an unknown format or for llama2.
  ChatTemplate with_tool_format(const std::string& format) const;
  // llama3's "Today Date:" line ("26 Jul 2024"); today_tool_date() unless set.
  const std::string& tool_date() const { return tool_date_; }
  ChatTemplate with_tool_date(std::string date) const;
  std::string render(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options = {}) const;
  RenderedChat render_with_spans(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options = {}) const;
  // The same template as Jinja for tokenizer_config.json's chat_template (with its default
  // system prompt and tool format), so transformers' apply_chat_template renders what render()
  // does; an exported model without a chat template gets this one. Tool conversations take
  // transformers' shape there: `tools` a list; a function call an assistant message with
  // "tool_calls" ([{"type": "function", "function": {"name", "arguments"}}]) whose content is
  // the text render() keeps in front of the calls; observations "tool" messages (consecutive
  // ones joined as LlamaFactory's openai converter joins them); llama3's date the `date_string`
  // variable, else transformers' strftime_now, else tool_date().
  // qwen3 is Qwen3's own template, which writes tool conversations its own way where render()
  // writes LlamaFactory's: without a system prompt no "\n\n" before "# Tools", an empty tools
  // list opens no system block, tools are written as given (render() wraps each in
  // {"type": "function", "function": ...}), a "\n" between text and the first call, string
  // arguments written raw. With a system prompt, wrapped tools and calls alone the two agree.
  std::string jinja() const;

 private:
  ChatTemplate(std::string name, std::string eos_token, std::string default_system, std::string tool_format)
      : name_(std::move(name)),
        eos_token_(std::move(eos_token)),
        default_system_(std::move(default_system)),
        tool_format_(std::move(tool_format)) {}
  std::string name_;
  std::string eos_token_;
  std::string default_system_;
  std::string tool_format_;
  bool tool_format_set_ = false;  // with_tool_format(): function calls end with eos alone
  std::string tool_date_;
};

}  // namespace hyperparallel::data
