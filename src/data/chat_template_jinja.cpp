// Each chat template as Jinja, for tokenizer_config.json's chat_template. See data/chat_template.h.
#include "hyperparallel/data/chat_template.h"

namespace hyperparallel::data {
namespace {

// Qwen3's own template, as Qwen3's tokenizer_config.json carries it (tools included).
constexpr const char* kQwen3 = R"jinja({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %})jinja";

constexpr const char* kChatml =
    "{%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

constexpr const char* kLlama3 =
    "{{- '<|begin_of_text|>' -}}{%- for m in messages -%}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + (m['content'] | trim) + '<|eot_id|>' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}";

constexpr const char* kLlama2 =
    "{%- if messages and messages[0]['role'] == 'system' -%}{%- set sys = messages[0]['content'] -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set sys = none -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for m in turns -%}"
    "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}{{- raise_exception('roles must alternate user/assistant/user/...') -}}{%- endif -%}"
    "{%- if loop.first and sys is not none -%}{%- set content = '<<SYS>>\\n' + sys + '\\n<</SYS>>\\n\\n' + m['content'] -%}"
    "{%- else -%}{%- set content = m['content'] -%}{%- endif -%}"
    "{%- if m['role'] == 'user' -%}{{- '<s>[INST] ' + (content | trim) + ' [/INST]' -}}"
    "{%- else -%}{{- ' ' + (content | trim) + ' </s>' -}}{%- endif -%}{%- endfor -%}";

// A Jinja string literal holding `text`.
std::string literal(const std::string& text) {
  std::string out = "'";
  for (char ch : text) {
    if (ch == '\\' || ch == '\'') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else {
      out += ch;
    }
  }
  return out + "'";
}

std::string default_body(const std::string& eos) {
  const std::string e = literal(eos);
  return "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{- 'System: ' + m['content'] + " + e +
         " + '\\n' -}}{%- elif m['role'] == 'user' -%}{{- 'Human: ' + m['content'] + " + e +
         " + '\\nAssistant:' -}}{%- else -%}{{- m['content'] + " + e + " + '\\n' -}}{%- endif -%}{%- endfor -%}";
}

// Puts the default system prompt in front when the conversation has none (or an empty one),
// as render() does, by rebinding `messages` for the body that follows.
std::string default_system_preamble(const std::string& system) {
  if (system.empty()) return "";
  const std::string first = "[{'role': 'system', 'content': " + literal(system) + "}]";
  return "{%- if messages and messages[0]['role'] == 'system' and messages[0]['content'] -%}"
         "{%- elif messages and messages[0]['role'] == 'system' -%}{%- set messages = " + first + " + messages[1:] -%}"
         "{%- else -%}{%- set messages = " + first + " + messages -%}{%- endif -%}";
}

}  // namespace

std::string ChatTemplate::jinja() const {
  std::string body;
  if (name_ == "qwen3") {
    body = kQwen3;
  } else if (name_ == "qwen" || name_ == "qwen3_nothink") {
    body = kChatml;
  } else if (name_ == "llama3") {
    body = kLlama3;
  } else if (name_ == "llama2") {
    body = kLlama2;
  } else {
    body = default_body(eos_token_);
  }
  return default_system_preamble(default_system_) + body;
}

}  // namespace hyperparallel::data
