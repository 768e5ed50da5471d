// The chat templates, transcribed from the models' Jinja templates. See data/chat_template.h.
#include "hyperparallel/data/chat_template.h"

#include <algorithm>

#include "hyperparallel/data/tool_calls.h"
#include "hyperparallel/platform/suggest.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::data {
namespace {

constexpr const char* kWhitespace = " \t\n\r\f\v";

std::string strip(const std::string& s, const char* chars = kWhitespace) {
  const size_t first = s.find_first_not_of(chars);
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(chars) - first + 1);
}
std::string lstrip(const std::string& s, const char* chars) {
  const size_t first = s.find_first_not_of(chars);
  return first == std::string::npos ? "" : s.substr(first);
}
std::string rstrip(const std::string& s, const char* chars) {
  const size_t last = s.find_last_not_of(chars);
  return last == std::string::npos ? "" : s.substr(0, last + 1);
}

void check_roles(const std::string& name, const std::vector<ChatMessage>& messages, bool tool_turns) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role == "user" || role == "assistant" || (role == "system" && i == 0)) continue;
    if (tool_turns && (role == "function" || role == "observation")) continue;
    if (!tool_turns && (role == "function" || role == "observation")) {
      throw UserError("chat template " + name + " renders no tool calls (message " + std::to_string(i) + " is " + role +
                      "): its turns here are Meta's Llama 2 format, not LlamaFactory's; use template default, llama3, qwen, "
                      "qwen3 or qwen3_nothink");
    }
    throw UserError("chat template " + name + ": message " + std::to_string(i) + " has role '" + role +
                    "'; roles are system (first message only), user, assistant, function, observation");
  }
}

// Builds the rendered text and records which parts are assistant responses.
class ChatWriter {
 public:
  void prompt(const std::string& text) { chat_.text += text; }
  void response(const std::string& text) {
    chat_.responses.push_back({chat_.text.size(), chat_.text.size() + text.size()});
    chat_.text += text;
  }
  RenderedChat take() { return std::move(chat_); }

 private:
  RenderedChat chat_;
};

// What one render needs beyond the messages.
struct RenderContext {
  const ChatRenderOptions& options;
  std::string tool_format;
  bool eos_only = false;        // function calls end with the eos token alone (tool_format set)
  bool system_has_tools = false;  // the first message is the system prompt with the tool text
  std::string function_text(const ChatMessage& m) const { return format_function_call(tool_format, m.content); }
};

// LlamaFactory's observation slot of the qwen templates (the assistant header follows with the next turn).
std::string qwen_observation(const std::string& content) {
  return "<|im_start|>user\n<tool_response>\n" + content + "\n</tool_response><|im_end|>\n";
}

void render_chatml(const std::vector<ChatMessage>& messages, const RenderContext& ctx, ChatWriter& out) {
  for (const auto& m : messages) {
    if (m.role == "observation") {
      out.prompt(qwen_observation(m.content));
      continue;
    }
    if (m.role == "function") {
      out.prompt("<|im_start|>assistant\n");
      out.response(ctx.function_text(m) + "<|im_end|>");
      if (!ctx.eos_only) out.prompt("\n");
      continue;
    }
    out.prompt("<|im_start|>" + m.role + "\n");
    if (m.role == "assistant") {
      out.response(m.content + "<|im_end|>");
    } else {
      out.prompt(m.content + "<|im_end|>");
    }
    out.prompt("\n");
  }
  if (ctx.options.add_generation_prompt) out.prompt("<|im_start|>assistant\n");
}

void render_qwen3(const std::vector<ChatMessage>& messages, const RenderContext& ctx, ChatWriter& out) {
  if (!messages.empty() && messages[0].role == "system") out.prompt("<|im_start|>system\n" + messages[0].content + "<|im_end|>\n");
  // The last user query bounds the "current" turn; observations, and user messages that are
  // wrapped tool responses, are not queries (Qwen3's multi_step_tool rule).
  int64_t last_query = static_cast<int64_t>(messages.size()) - 1;
  for (int64_t i = last_query; i >= 0; --i) {
    const std::string& c = messages[i].content;
    const bool wrapped = c.rfind("<tool_response>", 0) == 0 && c.size() >= 16 && c.compare(c.size() - 16, 16, "</tool_response>") == 0;
    if (messages[i].role == "user" && !wrapped) {
      last_query = i;
      break;
    }
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      out.prompt("<|im_start|>user\n" + m.content + "<|im_end|>\n");
    } else if (m.role == "observation") {
      out.prompt(qwen_observation(m.content));
    } else if (m.role == "assistant" || m.role == "function") {
      const std::string text = m.role == "function" ? ctx.function_text(m) : m.content;
      std::string content = text, reasoning;
      const size_t close = text.rfind("</think>");
      if (close != std::string::npos) {
        content = lstrip(text.substr(close + 8), "\n");
        std::string before = rstrip(text.substr(0, text.find("</think>")), "\n");
        const size_t open = before.rfind("<think>");
        reasoning = lstrip(open == std::string::npos ? before : before.substr(open + 7), "\n");
      }
      const bool last = i + 1 == messages.size();
      out.prompt("<|im_start|>assistant\n");
      if (static_cast<int64_t>(i) > last_query && (last || !reasoning.empty())) {
        out.response("<think>\n" + strip(reasoning, "\n") + "\n</think>\n\n" + lstrip(content, "\n") + "<|im_end|>");
      } else {
        out.response(content + "<|im_end|>");
      }
      if (!(m.role == "function" && ctx.eos_only)) out.prompt("\n");
    }
  }
  if (ctx.options.add_generation_prompt) {
    out.prompt("<|im_start|>assistant\n");
    if (!ctx.options.enable_thinking) out.prompt("<think>\n\n</think>\n\n");
  }
}

void render_llama3(const std::vector<ChatMessage>& messages, const RenderContext& ctx, ChatWriter& out) {
  out.prompt("<|begin_of_text|>");
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "observation") {
      out.prompt("<|start_header_id|>ipython<|end_header_id|>\n\n" + m.content + "<|eot_id|>");
      continue;
    }
    out.prompt("<|start_header_id|>" + std::string(m.role == "function" ? "assistant" : m.role) + "<|end_header_id|>\n\n");
    if (m.role == "function") {
      out.response(ctx.function_text(m) + "<|eot_id|>");
    } else if (m.role == "assistant") {
      out.response(strip(m.content) + "<|eot_id|>");
    } else {
      out.prompt((i == 0 && ctx.system_has_tools ? m.content : strip(m.content)) + "<|eot_id|>");
    }
  }
  if (ctx.options.add_generation_prompt) out.prompt("<|start_header_id|>assistant<|end_header_id|>\n\n");
}

void render_llama2(const std::vector<ChatMessage>& messages, ChatWriter& out) {
  std::string system;
  size_t first = 0;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    first = 1;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if ((m.role == "user") != ((i - first) % 2 == 0)) {
      throw UserError("chat template llama2: roles must alternate user/assistant/user/...; message " + std::to_string(i) +
                      " is " + m.role);
    }
    // As the template: the system block is prepended to the first user message, then stripped.
    const std::string content = (i == first && first == 1 ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n" : "") + m.content;
    if (m.role == "user") {
      out.prompt("<s>[INST] " + strip(content) + " [/INST]");
    } else {
      out.prompt(" ");
      out.response(strip(content) + " </s>");
    }
  }
  // Llama 2's prompt ends with [/INST]; a generation prompt adds nothing.
}

// LlamaFactory's "default": the assistant cue is part of the user turn (and of an
// observation, which is written as one), so a generation prompt adds nothing.
void render_default(const std::vector<ChatMessage>& messages, const std::string& eos, const RenderContext& ctx, ChatWriter& out) {
  for (const auto& m : messages) {
    if (m.role == "system") {
      out.prompt("System: " + m.content + eos + "\n");
    } else if (m.role == "user" || m.role == "observation") {
      out.prompt("Human: " + m.content + eos + "\nAssistant:");
    } else if (m.role == "function") {
      out.response(ctx.function_text(m) + eos);
      if (!ctx.eos_only) out.prompt("\n");
    } else {
      out.response(m.content + eos);
      out.prompt("\n");
    }
  }
}

}  // namespace

std::vector<std::string> ChatTemplate::names() { return {"default", "llama2", "llama3", "qwen", "qwen3", "qwen3_nothink"}; }

ChatTemplate ChatTemplate::named(const std::string& name, const std::string& eos_token) {
  const auto all = names();
  if (std::find(all.begin(), all.end(), name) == all.end()) {
    throw UserError("template '" + name + "' is not a known chat template; known: " + join_names(all));
  }
  if (name == "default" && eos_token.empty()) {
    throw UserError("chat template default ends every turn with the tokenizer's eos token, and this tokenizer has none "
                    "(eos_token in tokenizer_config.json); set it there or pick another template");
  }
  // LlamaFactory's default system prompts and tool formats (its template.py).
  const std::string default_system = name == "qwen" ? "You are Qwen, created by Alibaba Cloud. You are a helpful assistant." : "";
  const std::string tool_format = name == "llama2" ? "" : name == "llama3" ? "llama3" : name == "default" ? "default" : "qwen";
  ChatTemplate t(name, eos_token, default_system, tool_format);
  t.tool_date_ = today_tool_date();
  return t;
}

ChatTemplate ChatTemplate::with_default_system(std::string system) const {
  ChatTemplate copy = *this;
  copy.default_system_ = std::move(system);
  return copy;
}

ChatTemplate ChatTemplate::with_tool_format(const std::string& format) const {
  check_tool_format(format);
  if (name_ == "llama2") {
    throw UserError("tool_format " + format + " with template llama2: llama2 renders no tool calls here (its turns are Meta's "
                    "Llama 2 format, not LlamaFactory's); use template default, llama3, qwen, qwen3 or qwen3_nothink, or "
                    "remove tool_format");
  }
  ChatTemplate copy = *this;
  copy.tool_format_ = format;
  copy.tool_format_set_ = true;
  return copy;
}

ChatTemplate ChatTemplate::with_tool_date(std::string date) const {
  ChatTemplate copy = *this;
  copy.tool_date_ = std::move(date);
  return copy;
}

RenderedChat ChatTemplate::render_with_spans(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) const {
  check_roles(name_, messages, !tool_format_.empty());
  if (!options.tools.empty() && tool_format_.empty()) {
    throw UserError("chat template " + name_ + " renders no tool calls, and this conversation has tools: its turns here are "
                    "Meta's Llama 2 format, not LlamaFactory's; use template default, llama3, qwen, qwen3 or qwen3_nothink");
  }
  RenderContext ctx{options, tool_format_, tool_format_set_, !options.tools.empty()};
  // LlamaFactory: system = system or default_system, then the tool text after it; tools open a
  // system block even when both are empty.
  const bool has_system = !messages.empty() && messages[0].role == "system";
  const bool add_default = !default_system_.empty() && (!has_system || messages[0].content.empty());
  std::vector<ChatMessage> adjusted;
  if (add_default || ctx.system_has_tools) {
    adjusted = messages;
    if (!has_system) adjusted.insert(adjusted.begin(), {"system", ""});
    if (add_default) adjusted[0].content = default_system_;
    if (ctx.system_has_tools) adjusted[0].content += format_tools(tool_format_, options.tools, tool_date_);
  }
  const std::vector<ChatMessage>& m = add_default || ctx.system_has_tools ? adjusted : messages;
  ChatWriter out;
  if (name_ == "qwen3") {
    render_qwen3(m, ctx, out);
  } else if (name_ == "qwen" || name_ == "qwen3_nothink") {
    render_chatml(m, ctx, out);
  } else if (name_ == "llama3") {
    render_llama3(m, ctx, out);
  } else if (name_ == "llama2") {
    render_llama2(m, out);
  } else {
    render_default(m, eos_token_, ctx, out);
  }
  return out.take();
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) const {
  return render_with_spans(messages, options).text;
}

}  // namespace hyperparallel::data
