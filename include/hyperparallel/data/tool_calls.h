// Tool calls in LlamaFactory's tool formats: the text a chat template writes for a
// conversation's tool descriptions, and for a function-call turn.
//
// A tool conversation (LlamaFactory's sharegpt roles) has a `tools` value — the JSON text of
// a list of function descriptions, {"name", "description", "parameters"} or OpenAI's
// {"type": "function", "function": {...}} — and turns of two more roles: "function" (the
// assistant calls tools: content {"name": ..., "arguments": ...} or a list of them) and
// "observation" (what the tools returned, plain text). The chat template (chat_template.h)
// puts the tool text after the system prompt and writes the function calls and observations
// into its own turns; this header holds the format-specific text, transcribed from
// LlamaFactory's data/tool_utils.py and data/formatter.py (FunctionFormatter, ToolFormatter):
//
//   qwen     tools: QWEN_TOOL_PROMPT ("\n\n# Tools ... <tools>" + "\n" + json per tool +
//            "\n</tools> ... </tool_call>"), each tool wrapped as {"type": "function",
//            "function": tool} unless it already is; calls: "<tool_call>\n" +
//            json {"name", "arguments"} + "\n</tool_call>", joined by "\n"
//   llama3   tools: LLAMA3_TOOL_PROMPT with "Today Date: {date}" and each wrapped tool as
//            json with indent=4 + "\n\n"; calls: json {"name", "parameters"} (a list of them
//            for parallel calls)
//   default  tools: DEFAULT_TOOL_PROMPT ("You have access to the following tools:" with a
//            "> Tool Name / Tool Description / Tool Args" block per tool); calls:
//            "Action: name\nAction Input: json", joined by "\n"
//
// Every json here is Python's json.dumps(..., ensure_ascii=False) of the parsed value, byte
// for byte (src/data/python_json.h): key order kept, ", " / ": " separators, non-ASCII text
// as is, floats as Python writes them. A function call's content may carry text besides the
// JSON, as LlamaFactory's FunctionFormatter allows: a "<think>\n...\n</think>\n\n" block is
// kept in front of the calls; with "<tool_call>JSON</tool_call>" inside, the JSON is taken from
// the first such span and the rest of the content (every copy of that span removed) goes in
// front.
//
// Errors are UserErrors saying what is wrong with the value (dataset loading turns them into
// bad records named file:line). Where LlamaFactory would crash or write a Python repr, this
// refuses: tools that are not a list of objects, calls without a string "name" or without
// "arguments", and for the default format list- or object-valued parameter fields it would
// print with Python's str().
#pragma once

#include <string>
#include <vector>

namespace hyperparallel::data {

// The tool formats implemented here, by LlamaFactory's names: default, llama3, qwen.
std::vector<std::string> tool_format_names();

// UserError for a name that is not implemented (LlamaFactory's other formats are named as such).
void check_tool_format(const std::string& format);

// LlamaFactory's ToolFormatter: the text appended to the system prompt; "" for an empty list.
// `date` fills llama3's "Today Date:" line.
std::string format_tools(const std::string& format, const std::string& tools, const std::string& date);

// LlamaFactory's FunctionFormatter without the template's slots: the function-call turn's text.
std::string format_function_call(const std::string& format, const std::string& content);

// What every format needs, for dataset loading: tools a JSON list of objects; a function call
// that parses as above.
void check_tools(const std::string& tools);
void check_function_call(const std::string& content);

// Today's local date as LlamaFactory's llama3 tool prompt writes it, strftime("%d %b %Y") in
// English: "05 Mar 2026".
std::string today_tool_date();

}  // namespace hyperparallel::data
