// The fixed text of LlamaFactory's tool prompts (data/tool_utils.py, after Python's
// str.format: "{{" is "{"), split where the tools and the date go; shared by the C++ rendering
// (tool_calls.cpp) and the exported Jinja (chat_template_jinja.cpp) so the two cannot drift.
#pragma once

namespace hyperparallel::data::tool_prompts {

// QWEN_TOOL_PROMPT = kQwenBefore + tool_text + kQwenAfter
inline constexpr const char* kQwenBefore =
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
inline constexpr const char* kQwenAfter =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

// LLAMA3_TOOL_PROMPT = kLlama3BeforeDate + date + kLlama3AfterDate + tool_text
inline constexpr const char* kLlama3BeforeDate = "Cutting Knowledge Date: December 2023\nToday Date: ";
inline constexpr const char* kLlama3AfterDate =
    "\n\nYou have access to the following functions. To call a function, please respond with JSON for a function call. "
    "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}. "
    "Do not use variables.\n\n";

// DEFAULT_TOOL_PROMPT = kDefaultBefore + tool_text + kDefaultMiddle + tool_names + kDefaultAfter
inline constexpr const char* kDefaultBefore = "You have access to the following tools:\n";
inline constexpr const char* kDefaultMiddle = "Use the following format if using a tool:\n```\nAction: tool name (one of [";
inline constexpr const char* kDefaultAfter =
    "])\nAction Input: the input to the tool, in a JSON format representing the kwargs "
    "(e.g. ```{\"input\": \"hello world\", \"num_beams\": 5}```)\n```\n";

}  // namespace hyperparallel::data::tool_prompts
