// Each chat template as Jinja, for tokenizer_config.json's chat_template. See data/chat_template.h.
#include "hyperparallel/data/chat_template.h"

#include "tool_prompts.h"

namespace hyperparallel::data {
namespace {

using namespace tool_prompts;

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

// The Jinja of the tool formats (data/tool_calls.h), written for transformers' conventions:
// `tools` a list, an assistant message's "tool_calls", "tool" messages. transformers' tojson is
// json.dumps(..., ensure_ascii=False), so it writes what tool_calls.cpp writes.

// Sets ns.tool_text to the tool format's text for `tools` (empty list: "").
std::string tools_jinja(const std::string& format, const std::string& date) {
  const std::string wrap =
      "{%- if 'type' in t and t['type'] == 'function' -%}{%- set w = t -%}"
      "{%- else -%}{%- set w = {'type': 'function', 'function': t} -%}{%- endif -%}";
  if (format == "qwen") {
    return "{%- for t in tools -%}" + wrap + "{%- set ns.tool_text = ns.tool_text + '\\n' + (w | tojson) -%}{%- endfor -%}"
           "{%- if tools -%}{%- set ns.tool_text = " + literal(kQwenBefore) + " + ns.tool_text + " + literal(kQwenAfter) +
           " -%}{%- endif -%}";
  }
  if (format == "llama3") {
    return "{%- for t in tools -%}" + wrap + "{%- set ns.tool_text = ns.tool_text + (w | tojson(indent=4)) + '\\n\\n' -%}{%- endfor -%}"
           "{%- if date_string is defined -%}{%- set tool_date = date_string -%}"
           "{%- elif strftime_now is defined -%}{%- set tool_date = strftime_now('%d %b %Y') -%}"
           "{%- else -%}{%- set tool_date = " + literal(date) + " -%}{%- endif -%}"
           "{%- if tools -%}{%- set ns.tool_text = " + literal(kLlama3BeforeDate) + " + tool_date + " + literal(kLlama3AfterDate) +
           " + ns.tool_text -%}{%- endif -%}";
  }
  // default: Python's str.format of the fields is Jinja's `string` filter (str()).
  const auto field = [](const std::string& obj, const std::string& key) {
    return "((" + obj + "['" + key + "'] if '" + key + "' in " + obj + " else '') | string)";
  };
  return "{%- for t in tools -%}"
         "{%- if 'type' in t and t['type'] == 'function' -%}{%- set t = t['function'] -%}{%- endif -%}"
         "{%- set ps = t['parameters'] -%}{%- set pn = namespace(text='') -%}"
         "{%- for pname, p in ps['properties'].items() -%}"
         "{%- set req = ', required' if ('required' in ps and pname in ps['required']) else '' -%}"
         "{%- set en = (', should be one of [' + (p['enum'] | join(', ')) + ']') if ('enum' in p and p['enum']) else '' -%}"
         "{%- set it = (', where each item should be ' + " + field("p['items']", "type") +
         ") if ('items' in p and p['items']) else '' -%}"
         "{%- set pn.text = pn.text + '  - ' + pname + ' (' + " + field("p", "type") + " + req + '): ' + " + field("p", "description") +
         " + en + it + '\\n' -%}"
         "{%- endfor -%}"
         "{%- set ns.tool_text = ns.tool_text + '> Tool Name: ' + t['name'] + '\\nTool Description: ' + " + field("t", "description") +
         " + '\\nTool Args:\\n' + pn.text + '\\n' -%}"
         "{%- set ns.names = ns.names + (', ' if not loop.first else '') + t['name'] -%}"
         "{%- endfor -%}"
         "{%- if tools -%}{%- set ns.tool_text = " + literal(kDefaultBefore) + " + ns.tool_text + " + literal(kDefaultMiddle) +
         " + ns.names + " + literal(kDefaultAfter) +
         " -%}{%- endif -%}";
}

// Writes message m's tool calls as the format writes them.
std::string calls_jinja(const std::string& format) {
  const std::string f = "{%- set f = tc['function'] if 'function' in tc else tc -%}";
  if (format == "qwen") {
    return "{%- for tc in m['tool_calls'] -%}" + f +
           "{{- ('\\n' if not loop.first else '') + '<tool_call>\\n' + ({'name': f['name'], 'arguments': f['arguments']} | tojson) "
           "+ '\\n</tool_call>' -}}{%- endfor -%}";
  }
  if (format == "llama3") {
    return "{%- if m['tool_calls'] | length != 1 -%}{{- '[' -}}{%- endif -%}{%- for tc in m['tool_calls'] -%}" + f +
           "{{- (', ' if not loop.first else '') + ({'name': f['name'], 'parameters': f['arguments']} | tojson) -}}{%- endfor -%}"
           "{%- if m['tool_calls'] | length != 1 -%}{{- ']' -}}{%- endif -%}";
  }
  return "{%- for tc in m['tool_calls'] -%}" + f +
         "{{- ('\\n' if not loop.first else '') + 'Action: ' + f['name'] + '\\nAction Input: ' + (f['arguments'] | tojson) -}}"
         "{%- endfor -%}";
}

// A template of LlamaFactory's slots with tool turns: system block (with the tool text when
// `tools` is given, even an empty list), user, assistant, function-call and observation turns
// (consecutive "tool" messages are one observation, joined as LlamaFactory's openai converter joins them).
struct Slots {
  std::string prefix;                       // before everything
  std::string system_open, system_close;    // around the system text
  std::string turn_open_before_role, turn_open_after_role, turn_close;  // a plain message
  bool trim = false;                        // plain content | trim (llama3)
  std::string assistant_open, function_close;  // a function-call turn
  std::string observation_open, observation_close;
  std::string generation;                   // add_generation_prompt
};

std::string slots_jinja(const Slots& s, const std::string& format, const std::string& date) {
  const std::string content = s.trim ? "(m['content'] | trim)" : "m['content']";
  std::string j = s.prefix.empty() ? "" : "{{- " + literal(s.prefix) + " -}}";
  j += "{%- set ns = namespace(tool_text='', names='') -%}{%- set loop_messages = messages -%}"
       "{%- if tools is defined and tools is not none -%}" + tools_jinja(format, date) +
       "{%- if messages and messages[0]['role'] == 'system' -%}{%- set sys = messages[0]['content'] -%}"
       "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set sys = '' -%}{%- endif -%}"
       "{{- " + literal(s.system_open) + " + sys + ns.tool_text + " + literal(s.system_close) + " -}}{%- endif -%}";
  j += "{%- for m in loop_messages -%}"
       "{%- if m['role'] == 'tool' -%}"
       "{%- if loop.first or loop_messages[loop.index0 - 1]['role'] != 'tool' -%}{{- " + literal(s.observation_open) +
       " -}}{%- else -%}{{- '\\n</tool_response>\\n<tool_response>\\n' -}}{%- endif -%}{{- m['content'] -}}"
       "{%- if loop.last or loop_messages[loop.index0 + 1]['role'] != 'tool' -%}{{- " + literal(s.observation_close) +
       " -}}{%- endif -%}"
       "{%- elif m['role'] == 'assistant' and 'tool_calls' in m and m['tool_calls'] -%}"
       "{{- " + literal(s.assistant_open) + " + (m['content'] if 'content' in m and m['content'] else '') -}}" + calls_jinja(format) +
       "{{- " + literal(s.function_close) + " -}}"
       "{%- else -%}{{- " + literal(s.turn_open_before_role) + " + m['role'] + " + literal(s.turn_open_after_role) + " + " +
       content + " + " + literal(s.turn_close) + " -}}{%- endif -%}{%- endfor -%}";
  if (!s.generation.empty()) j += "{%- if add_generation_prompt -%}{{- " + literal(s.generation) + " -}}{%- endif -%}";
  return j;
}

// LlamaFactory's "default" template: the role decides the words, and the assistant cue belongs
// to the user turn (and to an observation, written as one).
std::string default_jinja(const std::string& eos, const std::string& format, bool eos_only, const std::string& date) {
  const std::string e = literal(eos);
  return "{%- set ns = namespace(tool_text='', names='') -%}{%- set loop_messages = messages -%}"
         "{%- if tools is defined and tools is not none -%}" + tools_jinja(format, date) +
         "{%- if messages and messages[0]['role'] == 'system' -%}{%- set sys = messages[0]['content'] -%}"
         "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set sys = '' -%}{%- endif -%}"
         "{{- 'System: ' + sys + ns.tool_text + " + e + " + '\\n' -}}{%- endif -%}"
         "{%- for m in loop_messages -%}"
         "{%- if m['role'] == 'tool' -%}"
         "{%- if loop.first or loop_messages[loop.index0 - 1]['role'] != 'tool' -%}{{- 'Human: ' -}}"
         "{%- else -%}{{- '\\n</tool_response>\\n<tool_response>\\n' -}}{%- endif -%}{{- m['content'] -}}"
         "{%- if loop.last or loop_messages[loop.index0 + 1]['role'] != 'tool' -%}{{- " + e + " + '\\nAssistant:' -}}{%- endif -%}"
         "{%- elif m['role'] == 'system' -%}{{- 'System: ' + m['content'] + " + e + " + '\\n' -}}"
         "{%- elif m['role'] == 'user' -%}{{- 'Human: ' + m['content'] + " + e + " + '\\nAssistant:' -}}"
         "{%- elif 'tool_calls' in m and m['tool_calls'] -%}{{- (m['content'] if 'content' in m and m['content'] else '') -}}" +
         calls_jinja(format) + "{{- " + e + (eos_only ? "" : " + '\\n'") + " -}}"
         "{%- else -%}{{- m['content'] + " + e + " + '\\n' -}}{%- endif -%}{%- endfor -%}";
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
    Slots s;
    s.system_open = "<|im_start|>system\n";
    s.system_close = "<|im_end|>\n";
    s.turn_open_before_role = "<|im_start|>";
    s.turn_open_after_role = "\n";
    s.turn_close = "<|im_end|>\n";
    s.assistant_open = "<|im_start|>assistant\n";
    s.function_close = tool_format_set_ ? "<|im_end|>" : "<|im_end|>\n";
    s.observation_open = "<|im_start|>user\n<tool_response>\n";
    s.observation_close = "\n</tool_response><|im_end|>\n";
    s.generation = "<|im_start|>assistant\n";
    body = slots_jinja(s, tool_format_, tool_date_);
  } else if (name_ == "llama3") {
    Slots s;
    s.prefix = "<|begin_of_text|>";
    s.system_open = "<|start_header_id|>system<|end_header_id|>\n\n";
    s.system_close = "<|eot_id|>";
    s.turn_open_before_role = "<|start_header_id|>";
    s.turn_open_after_role = "<|end_header_id|>\n\n";
    s.turn_close = "<|eot_id|>";
    s.trim = true;
    s.assistant_open = "<|start_header_id|>assistant<|end_header_id|>\n\n";
    s.function_close = "<|eot_id|>";
    s.observation_open = "<|start_header_id|>ipython<|end_header_id|>\n\n";
    s.observation_close = "<|eot_id|>";
    s.generation = "<|start_header_id|>assistant<|end_header_id|>\n\n";
    body = slots_jinja(s, tool_format_, tool_date_);
  } else if (name_ == "llama2") {
    body = kLlama2;
  } else {
    body = default_jinja(eos_token_, tool_format_, tool_format_set_, tool_date_);
  }
  return default_system_preamble(default_system_) + body;
}

}  // namespace hyperparallel::data
