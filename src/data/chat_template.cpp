// The chat templates, transcribed from the models' Jinja templates. See data/chat_template.h.
#include "hyperparallel/data/chat_template.h"

#include <algorithm>

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

void check_roles(const std::string& name, const std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role == "user" || role == "assistant" || (role == "system" && i == 0)) continue;
    throw UserError("chat template " + name + ": message " + std::to_string(i) + " has role '" + role +
                    "'; roles are system (first message only), user, assistant");
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

void render_chatml(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options, ChatWriter& out) {
  for (const auto& m : messages) {
    out.prompt("<|im_start|>" + m.role + "\n");
    if (m.role == "assistant") {
      out.response(m.content + "<|im_end|>");
    } else {
      out.prompt(m.content + "<|im_end|>");
    }
    out.prompt("\n");
  }
  if (options.add_generation_prompt) out.prompt("<|im_start|>assistant\n");
}

void render_qwen3(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options, ChatWriter& out) {
  if (!messages.empty() && messages[0].role == "system") out.prompt("<|im_start|>system\n" + messages[0].content + "<|im_end|>\n");
  // The last user message (tool responses do not occur here) bounds the "current" turn.
  int64_t last_query = static_cast<int64_t>(messages.size()) - 1;
  for (int64_t i = last_query; i >= 0; --i) {
    if (messages[i].role == "user") {
      last_query = i;
      break;
    }
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      out.prompt("<|im_start|>user\n" + m.content + "<|im_end|>\n");
    } else if (m.role == "assistant") {
      std::string content = m.content, reasoning;
      const size_t close = m.content.rfind("</think>");
      if (close != std::string::npos) {
        content = lstrip(m.content.substr(close + 8), "\n");
        std::string before = rstrip(m.content.substr(0, m.content.find("</think>")), "\n");
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
      out.prompt("\n");
    }
  }
  if (options.add_generation_prompt) {
    out.prompt("<|im_start|>assistant\n");
    if (!options.enable_thinking) out.prompt("<think>\n\n</think>\n\n");
  }
}

void render_llama3(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options, ChatWriter& out) {
  out.prompt("<|begin_of_text|>");
  for (const auto& m : messages) {
    out.prompt("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n");
    if (m.role == "assistant") {
      out.response(strip(m.content) + "<|eot_id|>");
    } else {
      out.prompt(strip(m.content) + "<|eot_id|>");
    }
  }
  if (options.add_generation_prompt) out.prompt("<|start_header_id|>assistant<|end_header_id|>\n\n");
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

// LlamaFactory's "default": the assistant cue is part of the user turn, so a generation
// prompt adds nothing.
void render_default(const std::vector<ChatMessage>& messages, const std::string& eos, ChatWriter& out) {
  for (const auto& m : messages) {
    if (m.role == "system") {
      out.prompt("System: " + m.content + eos + "\n");
    } else if (m.role == "user") {
      out.prompt("Human: " + m.content + eos + "\nAssistant:");
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
  // LlamaFactory's default system prompts (its template.py): used when a conversation has none.
  const std::string default_system = name == "qwen" ? "You are Qwen, created by Alibaba Cloud. You are a helpful assistant." : "";
  return ChatTemplate(name, eos_token, default_system);
}

ChatTemplate ChatTemplate::with_default_system(std::string system) const {
  ChatTemplate copy = *this;
  copy.default_system_ = std::move(system);
  return copy;
}

RenderedChat ChatTemplate::render_with_spans(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) const {
  check_roles(name_, messages);
  if (!default_system_.empty() && (messages.empty() || messages[0].role != "system" || messages[0].content.empty())) {
    std::vector<ChatMessage> with_system = messages;
    if (!with_system.empty() && with_system[0].role == "system") with_system.erase(with_system.begin());
    with_system.insert(with_system.begin(), {"system", default_system_});
    ChatTemplate plain = with_default_system("");
    return plain.render_with_spans(with_system, options);
  }
  ChatWriter out;
  if (name_ == "qwen3") {
    render_qwen3(messages, options, out);
  } else if (name_ == "qwen" || name_ == "qwen3_nothink") {
    render_chatml(messages, options, out);
  } else if (name_ == "llama3") {
    render_llama3(messages, options, out);
  } else if (name_ == "llama2") {
    render_llama2(messages, out);
  } else {
    render_default(messages, eos_token_, out);
  }
  return out.take();
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) const {
  return render_with_spans(messages, options).text;
}

}  // namespace hyperparallel::data
