// The chat templates, transcribed from the models' Jinja templates. See data/chat_template.h.
#include "hyperparallel/data/chat_template.h"

#include <algorithm>

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

std::string render_chatml(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) {
  std::string out;
  for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string render_qwen3(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) {
  std::string out;
  if (!messages.empty() && messages[0].role == "system") out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
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
      out += "<|im_start|>user\n" + m.content + "<|im_end|>\n";
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
      if (static_cast<int64_t>(i) > last_query && (last || !reasoning.empty())) {
        out += "<|im_start|>assistant\n<think>\n" + strip(reasoning, "\n") + "\n</think>\n\n" + lstrip(content, "\n");
      } else {
        out += "<|im_start|>assistant\n" + content;
      }
      out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!options.enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

std::string render_llama3(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) {
  std::string out = "<|begin_of_text|>";
  for (const auto& m : messages) out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + strip(m.content) + "<|eot_id|>";
  if (options.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string render_llama2(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) {
  std::string out, system;
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
    out += m.role == "user" ? "<s>[INST] " + strip(content) + " [/INST]" : " " + strip(content) + " </s>";
  }
  (void)options;  // Llama 2's prompt ends with [/INST]; there is nothing to add
  return out;
}

}  // namespace

std::vector<std::string> ChatTemplate::names() { return {"llama2", "llama3", "qwen", "qwen3"}; }

ChatTemplate ChatTemplate::named(const std::string& name) {
  const auto all = names();
  if (std::find(all.begin(), all.end(), name) == all.end()) {
    std::string list;
    for (const auto& n : all) list += (list.empty() ? "" : ", ") + n;
    throw UserError("template '" + name + "' is not a known chat template; known: " + list);
  }
  return ChatTemplate(name);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) const {
  check_roles(name_, messages);
  if (name_ == "qwen3") return render_qwen3(messages, options);
  if (name_ == "qwen") return render_chatml(messages, options);
  if (name_ == "llama3") return render_llama3(messages, options);
  return render_llama2(messages, options);
}

}  // namespace hyperparallel::data
