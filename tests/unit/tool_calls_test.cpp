// Tool-call data as LlamaFactory renders it: the qwen / llama3 / default tool formats slot by
// slot, Python's json.dumps inside them, labels on function calls but not observations, tool
// datasets (LlamaFactory's own glaive demo records, sharegpt tags, the openai converter)
// through the registry, bad records named file:line, the exported Jinja, and a training run.
//
// The expected texts are written out from LlamaFactory's template.py / tool_utils.py /
// formatter.py (commit ff6d4d1): Template._encode renders message i as
//   i == 0: format_prefix + format_system(system + format_tools(tools))   (if system or tools)
//   then format_user / format_assistant / format_function / format_observation(content)
// where system = the conversation's or the template's default_system, format_function(content)
// = the template's function slot around tool_utils.function_formatter(calls), and
// format_tools = tool_utils.tool_formatter(json.loads(tools)).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/python_json.h"
#include "hyperparallel/data/chat_template.h"
#include "hyperparallel/data/dataset_registry.h"
#include "hyperparallel/data/sft_samples.h"
#include "hyperparallel/data/tokenizer.h"
#include "hyperparallel/data/tool_calls.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/train/train_config.h"
#include "support/subprocess.h"
#include "support/test_files.h"
#include "train/train_data.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;
using hp::data::ChatMessage;
using hp::data::ChatTemplate;

namespace {

// The repository's copy of the shared tokenizer fixtures (tests/fixtures/tokenizer/README.md).
const std::string kTokenizers = HP_SOURCE_DIR "/tests/fixtures/tokenizer";
const std::string kLlamaFactoryData = HP_SOURCE_DIR "/tests/fixtures/llamafactory/data";

const std::string kTools =
    R"([{"name": "get_weather", "description": "Weather of a city", "parameters": {"type": "object", )"
    R"("properties": {"city": {"type": "string"}}, "required": ["city"]}}])";

// A multi-step tool conversation: one call, its result, two parallel calls, their result, the answer.
// The calls are written compactly; json.dumps re-spaces them.
const std::vector<ChatMessage> kToolChat = {
    {"user", "Weather in Paris and Köln?"},
    {"function", R"({"name":"get_weather","arguments":{"city":"Paris"}})"},
    {"observation", R"({"temp": 21.5})"},
    {"function", R"([{"name":"get_weather","arguments":{"city":"Köln"}},{"name":"get_weather","arguments":{"city":"Bonn"}}])"},
    {"observation", "18"},
    {"assistant", "Paris 21.5, Köln 18."}};

hp::data::ChatRenderOptions with_tools(const std::string& tools = kTools) {
  hp::data::ChatRenderOptions o;
  o.tools = tools;
  return o;
}

// QwenToolUtils.tool_formatter: QWEN_TOOL_PROMPT with tool_text = "\n" + json.dumps of each tool,
// wrapped as {"type": "function", "function": tool}.
const std::string kQwenToolText =
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    R"({"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": )"
    R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})"
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

// The qwen templates after the system block. user: "<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n";
// function: "{{content}}<|im_end|>\n" around QwenToolUtils.function_formatter ("<tool_call>\n" +
// json.dumps({"name", "arguments"}) + "\n</tool_call>", joined by "\n"); observation:
// "<|im_start|>user\n<tool_response>\n{{content}}\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
// assistant: "{{content}}<|im_end|>\n".
const std::string kQwenTurns =
    "<|im_start|>user\nWeather in Paris and Köln?<|im_end|>\n<|im_start|>assistant\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n{\"temp\": 21.5}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Köln\"}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bonn\"}}\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n18\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    "Paris 21.5, Köln 18.<|im_end|>\n";

}  // namespace

TEST(ToolCalls, QwenTemplatesRenderLlamaFactorysToolSlots) {
  // qwen: system = default_system ("You are Qwen, ...") + the tool text, in
  // "<|im_start|>system\n{{content}}<|im_end|>\n".
  EXPECT_EQ(ChatTemplate::named("qwen").render(kToolChat, with_tools()),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant." + kQwenToolText +
                "<|im_end|>\n" + kQwenTurns);
  // qwen3_nothink has no default system: "" + tool text, so the block starts with "\n\n# Tools".
  EXPECT_EQ(ChatTemplate::named("qwen3_nothink").render(kToolChat, with_tools()),
            "<|im_start|>system\n" + kQwenToolText + "<|im_end|>\n" + kQwenTurns);
  // A system message comes first, the tool text right after it.
  std::vector<ChatMessage> with_system = kToolChat;
  with_system.insert(with_system.begin(), {"system", "Be brief."});
  EXPECT_EQ(ChatTemplate::named("qwen3_nothink").render(with_system, with_tools()),
            "<|im_start|>system\nBe brief." + kQwenToolText + "<|im_end|>\n" + kQwenTurns);
  // Without tools, function calls and observations still take their slots; "[]" is a tools
  // value that opens an empty system block (`if system or tools` on the string), as there.
  EXPECT_EQ(ChatTemplate::named("qwen3_nothink").render(kToolChat), kQwenTurns);
  EXPECT_EQ(ChatTemplate::named("qwen3_nothink").render(kToolChat, with_tools("[]")), "<|im_start|>system\n<|im_end|>\n" + kQwenTurns);
  // qwen3: the same tool text; think blocks as Qwen3 places them (the answer after the last
  // user query gets the empty block, the function calls before it do not).
  const std::string qwen3 = ChatTemplate::named("qwen3").render(kToolChat, with_tools());
  EXPECT_EQ(qwen3.substr(0, qwen3.find("<|im_start|>user")), "<|im_start|>system\n" + kQwenToolText + "<|im_end|>\n");
  EXPECT_NE(qwen3.find("<|im_start|>assistant\n<think>\n\n</think>\n\nParis 21.5"), std::string::npos) << qwen3;
  EXPECT_EQ(qwen3.find("<think>\n\n</think>\n\n<tool_call>"), std::string::npos) << qwen3;
}

TEST(ToolCalls, Llama3RendersLlamaFactorysToolSlotsWithAFixedDate) {
  // llama3: prefix <|begin_of_text|>; system "<|start_header_id|>system<|end_header_id|>\n\n{{content}}<|eot_id|>"
  // with content = system + LLAMA3_TOOL_PROMPT (no separator: LlamaFactory concatenates), whose
  // tool_text is json.dumps(tool, indent=4) + "\n\n" per tool; user "...user...{{content}}<|eot_id|>"
  // + the assistant header; function "{{content}}<|eot_id|>" around Llama3ToolUtils.function_formatter
  // (json.dumps({"name", "parameters"}), a list for parallel calls); observation
  // "<|start_header_id|>ipython<|end_header_id|>\n\n{{content}}<|eot_id|>" + the assistant header.
  std::vector<ChatMessage> chat = kToolChat;
  chat.insert(chat.begin(), {"system", "Answer briefly."});
  const std::string header = "<|start_header_id|>assistant<|end_header_id|>\n\n";
  const std::string expected =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nAnswer briefly."
      "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
      "You have access to the following functions. To call a function, please respond with JSON for a function call. "
      "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}. "
      "Do not use variables.\n\n"
      "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n"
      "        \"description\": \"Weather of a city\",\n        \"parameters\": {\n            \"type\": \"object\",\n"
      "            \"properties\": {\n                \"city\": {\n                    \"type\": \"string\"\n"
      "                }\n            },\n            \"required\": [\n                \"city\"\n            ]\n"
      "        }\n    }\n}\n\n<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWeather in Paris and Köln?<|eot_id|>" +
      header + "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>" +
      "<|start_header_id|>ipython<|end_header_id|>\n\n{\"temp\": 21.5}<|eot_id|>" + header +
      "[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Köln\"}}, {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Bonn\"}}]"
      "<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n18<|eot_id|>" +
      header + "Paris 21.5, Köln 18.<|eot_id|>";
  EXPECT_EQ(ChatTemplate::named("llama3").with_tool_date("26 Jul 2024").render(chat, with_tools()), expected);
  // Unset, the date is today's, written as LlamaFactory's datetime.now().strftime("%d %b %Y").
  const std::string today = hp::data::today_tool_date();
  EXPECT_EQ(ChatTemplate::named("llama3").tool_date(), today);
  ASSERT_EQ(today.size(), 11u);
  EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(today[0])) && today[2] == ' ' && today[6] == ' ') << today;
}

TEST(ToolCalls, ToolFormatKeyReplacesTheFormatAndEndsCallsWithEos) {
  // LlamaFactory's tool_format: format_function becomes FunctionFormatter(["{{content}}", eos])
  // — for the qwen templates eos is the stop word <|im_end|>, with no "\n" after it — and
  // format_tools that format's ToolFormatter; observations keep the template's slot.
  const std::vector<ChatMessage> chat = {{"user", "Hi"}, {"function", R"({"name": "f", "arguments": {"x": 1}})"},
                                         {"observation", "ok"}, {"assistant", "Done"}};
  const auto nothink = ChatTemplate::named("qwen3_nothink");
  EXPECT_EQ(nothink.tool_format(), "qwen");
  EXPECT_EQ(nothink.with_tool_format("qwen").render(chat),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call><|im_end|>"  // no "\n"
            "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\nDone<|im_end|>\n");
  EXPECT_EQ(nothink.with_tool_format("llama3").render(chat),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n{\"name\": \"f\", \"parameters\": {\"x\": 1}}<|im_end|>"
            "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\nDone<|im_end|>\n");
  // default (the default template's own): DefaultToolUtils' "Action: name\nAction Input: json",
  // its tool prompt with one "> Tool Name" block per tool; observations are user turns.
  const std::string tools =
      R"([{"name": "get_weather", "description": "Weather of a city", "parameters": {"type": "object", "properties": )"
      R"({"city": {"type": "string", "description": "City name", "enum": ["Paris", "Köln"]}, "days": {"type": "array", )"
      R"("items": {"type": "integer"}}}, "required": ["city"]}}])";
  const std::string tool_text =
      "You have access to the following tools:\n"
      "> Tool Name: get_weather\nTool Description: Weather of a city\nTool Args:\n"
      "  - city (string, required): City name, should be one of [Paris, Köln]\n"
      "  - days (array): , where each item should be integer\n\n"
      "Use the following format if using a tool:\n```\nAction: tool name (one of [get_weather])\n"
      "Action Input: the input to the tool, in a JSON format representing the kwargs "
      "(e.g. ```{\"input\": \"hello world\", \"num_beams\": 5}```)\n```\n";
  const auto plain = ChatTemplate::named("default", "</s>");
  const std::string turns_before_call = "Human: Hi</s>\nAssistant:Action: f\nAction Input: {\"x\": 1}</s>";
  const std::string turns_after_call = "Human: ok</s>\nAssistant:Done</s>\n";
  EXPECT_EQ(plain.render(chat, with_tools(tools)), "System: " + tool_text + "</s>\n" + turns_before_call + "\n" + turns_after_call);
  EXPECT_EQ(plain.with_tool_format("default").render(chat, with_tools(tools)),
            "System: " + tool_text + "</s>\n" + turns_before_call + turns_after_call);
  // Names LlamaFactory has but this library does not implement, unknown names, and llama2.
  EXPECT_NE(hp::testing::user_error_of([&] { nothink.with_tool_format("mistral"); }).find("tool_format mistral is LlamaFactory's but not implemented here; implemented: default, llama3, qwen"), std::string::npos);
  EXPECT_NE(hp::testing::user_error_of([&] { nothink.with_tool_format("qwenn"); }).find("did you mean 'qwen'?"), std::string::npos);
  EXPECT_NE(hp::testing::user_error_of([&] { ChatTemplate::named("llama2").with_tool_format("qwen"); }).find("llama2 renders no tool calls"), std::string::npos);
  EXPECT_NE(hp::testing::user_error_of([&] { ChatTemplate::named("llama2").render(chat); }).find("renders no tool calls"), std::string::npos);
  EXPECT_NE(hp::testing::user_error_of([&] { ChatTemplate::named("llama2").render({{"user", "a"}, {"assistant", "b"}}, with_tools()); }).find("has tools"), std::string::npos);
}

TEST(ToolCalls, JsonIsWrittenAsPythonsJsonDumps) {
  // json.dumps(json.loads(x), ensure_ascii=False): key order kept (a repeated key keeps its place
  // and its last value), ", " / ": ", non-ASCII as is, control characters escaped (\u0001
  // lowercase), U+2028 and "/" raw, floats in repr (1e+16 but 1000000000000000.0, 1e2 -> 100.0,
  // -0.0, 1.5e-07), integers as written.
  const std::string content =
      R"({"name":"f","arguments":{"b":1,"a":[1.0,1e16,1e15,0.1,-0.0,1E2,1.5e-7,0.0001,18446744073709551615,-5],)"
      R"("s":"é\"\\\n\t\u0001)" "\u2028" R"(/","b":2}})";
  EXPECT_EQ(hp::data::format_function_call("qwen", content),
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"b\": 2, \"a\": [1.0, 1e+16, 1000000000000000.0, 0.1, -0.0, 100.0, "
            "1.5e-07, 0.0001, 18446744073709551615, -5], \"s\": \"é\\\"\\\\\\n\\t\\u0001\u2028/\"}}\n</tool_call>");
  hp::data::OrderedJson nested;
  std::string error;
  ASSERT_TRUE(hp::data::python_json_loads(R"({"z": [], "y": {}, "x": [1, {"w": null}], "v": true})", nested, error)) << error;
  EXPECT_EQ(hp::data::python_json_dumps(nested, 2), "{\n  \"z\": [],\n  \"y\": {},\n  \"x\": [\n    1,\n    {\n      \"w\": null\n    }\n  ],\n  \"v\": true\n}");
  // FunctionFormatter: a "<think>\n...\n</think>\n\n" block stays in front of the calls; with a
  // <tool_call>...</tool_call> span the JSON is inside it and the rest goes in front.
  EXPECT_EQ(hp::data::format_function_call("qwen", "<think>\nplan\n</think>\n\n{\"name\": \"f\", \"arguments\": {}}"),
            "<think>\nplan\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(hp::data::format_function_call("llama3", "Checking.\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"),
            "Checking.\n{\"name\": \"f\", \"parameters\": {}}");
  // What Python would keep and a double cannot, and what Python would crash on, are refused.
  EXPECT_NE(hp::testing::user_error_of([] { hp::data::check_function_call(R"({"name": "f", "arguments": {"n": 123456789012345678901234567890}})"); })
                .find("does not fit 64 bits"),
            std::string::npos);
  EXPECT_NE(hp::testing::user_error_of([] { hp::data::check_function_call(R"({"name": "f", "arguments": NaN})"); }).find("not valid JSON"), std::string::npos);
  EXPECT_NE(hp::testing::user_error_of([] { hp::data::check_function_call(R"({"name": "f"})"); }).find("without \"arguments\""), std::string::npos);
  EXPECT_NE(hp::testing::user_error_of([] { hp::data::check_tools(R"({"name": "f"})"); }).find("tools is an object; it must be a JSON list"), std::string::npos);
  EXPECT_NE(hp::testing::user_error_of([] { hp::data::format_tools("default", R"([{"name": "f", "parameters": {}}])", ""); }).find("needs \"parameters\": {\"properties\""),
            std::string::npos);
}

TEST(ToolCalls, FunctionCallsAreTrainedAndObservationsAreNot) {
  // LlamaFactory pairs turns (prompt, response): function calls are responses (trained),
  // observations prompts (not), the system block with the tools too.
  const auto qwen = hp::data::Tokenizer::from_file(kTokenizers + "/qwen3");
  const auto row = hp::data::tokenize_conversation(qwen, ChatTemplate::named("qwen3_nothink"), kToolChat, {2048, false, false, with_tools()});
  EXPECT_EQ(row.input_ids, qwen.encode("<|im_start|>system\n" + kQwenToolText + "<|im_end|>\n" + kQwenTurns));
  EXPECT_EQ(hp::testing::labelled_runs(qwen, row),
            (std::vector<std::string>{"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>",
                                      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Köln\"}}\n</tool_call>\n"
                                      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bonn\"}}\n</tool_call><|im_end|>",
                                      "Paris 21.5, Köln 18.<|im_end|>"}));
  // mask_history: the last response only; train_on_prompt: everything but the first token.
  EXPECT_EQ(hp::testing::labelled_runs(qwen, hp::data::tokenize_conversation(qwen, ChatTemplate::named("qwen3_nothink"), kToolChat,
                                                               {2048, false, true, with_tools()})),
            std::vector<std::string>{"Paris 21.5, Köln 18.<|im_end|>"});
  const auto all = hp::data::tokenize_conversation(qwen, ChatTemplate::named("qwen3_nothink"), kToolChat, {2048, true, false, with_tools()});
  EXPECT_EQ(hp::data::label_tokens(all), static_cast<int64_t>(all.input_ids.size()) - 1);

  const auto llama = hp::data::Tokenizer::from_file(kTokenizers + "/llama3");
  const auto llama_row = hp::data::tokenize_conversation(llama, ChatTemplate::named("llama3").with_tool_date("26 Jul 2024"), kToolChat,
                                                         {2048, false, false, with_tools()});
  EXPECT_EQ(hp::testing::labelled_runs(llama, llama_row),
            (std::vector<std::string>{"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>",
                                      "[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Köln\"}}, "
                                      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Bonn\"}}]<|eot_id|>",
                                      "Paris 21.5, Köln 18.<|eot_id|>"}));
}

TEST(ToolCalls, LlamaFactorysGlaiveDemoLoadsThroughTheRegistry) {
  // Records copied from LlamaFactory's data/glaive_toolcall_{en,zh}_demo.json, with its own
  // dataset_info entries ({"messages": "conversations", "tools": "tools"}).
  const auto en = hp::data::load_datasets("glaive_toolcall_en_demo", kLlamaFactoryData);
  ASSERT_EQ(en.size(), 5u);
  std::vector<std::string> roles;
  for (const auto& m : en[0].messages) roles.push_back(m.role);
  EXPECT_EQ(roles, (std::vector<std::string>{"user", "assistant", "user", "function", "observation", "assistant", "user", "assistant"}));
  EXPECT_EQ(en[0].tools.rfind(R"([{"name": "search_recipes", "description": "Search for recipes based on ingredients")", 0), 0u);
  EXPECT_EQ(en[4].tools, "[]");
  const std::string text = ChatTemplate::named("qwen3_nothink").render(en[0].messages, with_tools(en[0].tools));
  EXPECT_EQ(text.rfind("<|im_start|>system\n\n\n# Tools\n\n", 0), 0u) << text;
  EXPECT_NE(text.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"search_recipes\", "), std::string::npos) << text;
  EXPECT_NE(text.find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"search_recipes\", \"arguments\": {\"ingredients\": "
                      "[\"chicken\", \"bell peppers\", \"rice\"]}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
                      "{\"recipes\": [{\"name\": \"Chicken and Bell Pepper Stir Fry\""),
            std::string::npos)
      << text;
  // Chinese text stays as is; 0.5 and 1 keep their Python spelling.
  const auto zh = hp::data::load_datasets("glaive_toolcall_zh_demo", kLlamaFactoryData);
  ASSERT_EQ(zh.size(), 2u);
  EXPECT_EQ(hp::data::format_function_call("qwen", zh[0].messages[1].content),
            "<tool_call>\n{\"name\": \"generate_invoice\", \"arguments\": {\"customer_name\": \"约翰·多伊\", \"items\": "
            "[{\"name\": \"苹果\", \"quantity\": 2, \"price\": 1}, {\"name\": \"香蕉\", \"quantity\": 3, \"price\": 0.5}]}}\n</tool_call>");

  // A dataset written here in the same format, with LlamaFactory's tags renaming the roles.
  const std::string dir = ::testing::TempDir() + "hp_tools_registry";
  fs::remove_all(dir);
  hp::testing::write_text_file(dir + "/dataset_info.json", R"({"calls": {"file_name": "calls.jsonl", "formatting": "sharegpt",
      "columns": {"messages": "turns", "tools": "functions", "system": "sys"},
      "tags": {"role_tag": "who", "content_tag": "text", "user_tag": "me", "assistant_tag": "bot",
               "function_tag": "call", "observation_tag": "result"}},
      "qa": {"file_name": "qa.jsonl", "columns": {"prompt": "q", "response": "a", "tools": "tools"}}})");
  hp::testing::write_text_file(dir + "/qa.jsonl", R"({"q": "Add 2 and 3", "a": "5", "tools": "[{\"name\": \"add\"}]"})" "\n");
  hp::testing::write_text_file(dir + "/calls.jsonl",
        R"({"turns": [{"who": "me", "text": "2+3?"}, {"who": "call", "text": "{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}"},)"
        R"( {"who": "result", "text": "5"}, {"who": "bot", "text": "5"}], "sys": "S", "functions": [{"name": "add", "parameters": {}}]})" "\n"
        R"({"turns": [{"who": "me", "text": "hi"}, {"who": "bot", "text": "hello"}], "tools": "ignored: not the named column"})" "\n");
  const auto mine = hp::data::load_datasets("calls", dir);
  ASSERT_EQ(mine.size(), 2u);
  roles.clear();
  for (const auto& m : mine[0].messages) roles.push_back(m.role);
  EXPECT_EQ(roles, (std::vector<std::string>{"system", "user", "function", "observation", "assistant"}));
  EXPECT_EQ(mine[0].tools, R"([{"name": "add", "parameters": {}}])");  // a list column, written as json.dumps would
  EXPECT_EQ(mine[1].tools, "");
  // alpaca records carry tools too (LlamaFactory's AlpacaDatasetConverter reads the column).
  EXPECT_EQ(hp::data::load_datasets("qa", dir).at(0).tools, R"([{"name": "add"}])");
}

TEST(ToolCalls, OpenAiMessagesFollowLlamaFactorysConverter) {
  // formatting: openai (OpenAIDatasetConverter): an assistant message with tool_calls becomes a
  // function call of their "function" objects; consecutive tool messages one observation; the
  // system prompt rule of that converter ("detailed thinking off" without tools).
  const std::string dir = ::testing::TempDir() + "hp_tools_openai";
  fs::remove_all(dir);
  hp::testing::write_text_file(dir + "/dataset_info.json", R"({"chat": {"file_name": "chat.jsonl", "formatting": "openai",
      "columns": {"messages": "messages", "tools": "tools"},
      "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
               "system_tag": "system", "observation_tag": "tool"}}})");
  hp::testing::write_text_file(dir + "/chat.jsonl",
        R"({"messages": [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": null, "tool_calls": [)"
        R"({"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},)"
        R"( {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "warm"}, {"role": "assistant", "content": "Nice."}],)"
        R"( "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]})" "\n"
        R"({"messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})" "\n");
  const auto data = hp::data::load_datasets("chat", dir);
  ASSERT_EQ(data.size(), 2u);
  ASSERT_EQ(data[0].messages.size(), 4u);
  EXPECT_EQ(data[0].messages[1].role, "function");
  EXPECT_EQ(data[0].messages[1].content, R"([{"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}])");
  EXPECT_EQ(data[0].messages[2].content, "sunny\n</tool_response>\n<tool_response>\nwarm");
  EXPECT_EQ(data[0].tools, R"([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}])");
  EXPECT_EQ(data[1].messages[0].content, "Be kind.\ndetailed thinking off");
  // The arguments are OpenAI's JSON string, so the call writes that string, as LlamaFactory does.
  EXPECT_NE(ChatTemplate::named("qwen").render(data[0].messages, with_tools(data[0].tools))
                .find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}\n</tool_call>"),
            std::string::npos);
}

TEST(ToolCalls, BadToolRecordsNameFileAndLine) {
  const std::string dir = ::testing::TempDir() + "hp_tools_bad";
  fs::remove_all(dir);
  hp::testing::write_text_file(dir + "/dataset_info.json",
        R"({"bad": {"file_name": "bad.jsonl", "formatting": "sharegpt", "columns": {"messages": "conversations", "tools": "tools"}}})");
  const std::string call = R"({\"name\": \"f\", \"arguments\": {}})";
  const std::string path = hp::testing::write_text_file(dir + "/bad.jsonl",
      R"({"conversations": [{"from": "human", "value": "a"}, {"from": "function_call", "value": ")" + call +
      R"("}, {"from": "observation", "value": "r"}, {"from": "gpt", "value": "b"}], "tools": "[{\"name\": \"f\", \"parameters\": {}}]"})" "\n"
      R"({"conversations": [{"from": "human", "value": "a"}, {"from": "observation", "value": "r"}]})" "\n"
      R"({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}], "tools": "[{name: f}]"})" "\n"
      R"({"conversations": [{"from": "human", "value": "a"}, {"from": "function_call", "value": "{name: f}"}]})" "\n"
      R"({"conversations": [{"from": "human", "value": "a"}, {"from": "function_call", "value": "{\"name\": \"f\"}"}]})" "\n"
      R"({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}], "tools": "{\"name\": \"f\"}"})" "\n");
  // Stop (the default): the first bad record, named.
  EXPECT_NE(hp::testing::user_error_of([&] { hp::data::load_datasets("bad", dir); })
                .find(path + ":2: turn 1 is observation, expected assistant or function"),
            std::string::npos);
  // Skip: every one listed, the good one kept.
  hp::data::SftLoadOptions skip;
  skip.on_bad_record = hp::data::BadRecordPolicy::kSkip;
  hp::data::SftLoadReport report;
  EXPECT_EQ(hp::data::load_datasets("bad", dir, skip, &report).size(), 1u);
  ASSERT_EQ(report.skipped.size(), 5u);
  EXPECT_NE(report.skipped[1].find(path + ":3: \"tools\": tools is not valid JSON"), std::string::npos) << report.skipped[1];
  EXPECT_NE(report.skipped[2].find(path + ":4: turn 1 (function call): the function call is not valid JSON"), std::string::npos)
      << report.skipped[2];
  EXPECT_NE(report.skipped[3].find(path + ":5: turn 1 (function call): the function call must be"), std::string::npos) << report.skipped[3];
  EXPECT_NE(report.skipped[4].find(path + ":6: \"tools\": tools is an object"), std::string::npos) << report.skipped[4];
  // With the run's tool format, what that format cannot write is a bad record too: the
  // default format lists parameters.properties, which the first record's tool lacks.
  skip.tool_format = "default";
  report.skipped.clear();
  EXPECT_EQ(hp::data::load_datasets("bad", dir, skip, &report).size(), 0u);
  EXPECT_NE(report.skipped[0].find(path + ":1: \"tools\": tools entry 0 (f) needs \"parameters\": {\"properties\""), std::string::npos)
      << report.skipped[0];
}

// The exported Jinja, under transformers' settings, renders tool conversations (in
// transformers' shape: tools a list, tool_calls, tool messages) exactly as render() does.
TEST(ToolCalls, JinjaRendersWhatRenderDoes) {
  using Json = hp::data::OrderedJson;
  Json tools;
  std::string error;
  ASSERT_TRUE(hp::data::python_json_loads(kTools, tools, error));
  // kToolChat as transformers messages; the second call's content is text before the calls.
  std::vector<ChatMessage> chat = kToolChat;
  chat[3].content = "<think>\nBoth.\n</think>\n\n" + chat[3].content;
  const auto hf_message = [](const ChatMessage& m) {
    if (m.role == "observation") return Json{{"role", "tool"}, {"content", m.content}};
    if (m.role != "function") return Json{{"role", m.role}, {"content", m.content}};
    const size_t json_at = m.content.find_first_of("[{");
    Json calls;
    std::string e;
    EXPECT_TRUE(hp::data::python_json_loads(m.content.substr(json_at), calls, e)) << e;
    if (!calls.is_array()) calls = Json::array({calls});
    Json tool_calls = Json::array();
    for (const auto& c : calls) tool_calls.push_back({{"type", "function"}, {"function", c}});
    return Json{{"role", "assistant"}, {"content", m.content.substr(0, json_at)}, {"tool_calls", tool_calls}};
  };
  std::vector<std::vector<ChatMessage>> conversations = {chat, {chat.begin(), chat.begin() + 4}};
  conversations.push_back(chat);
  conversations.back().insert(conversations.back().begin(), {"system", "Be 'brief'."});
  Json cases = Json::array();
  std::vector<std::string> expected;
  for (const std::string name : {"qwen", "qwen3_nothink", "llama3", "default"}) {
    for (const std::string format : {"", "qwen", "llama3", "default"}) {
      ChatTemplate t = ChatTemplate::named(name, "</s>").with_tool_date("26 Jul 2024");
      if (!format.empty()) t = t.with_tool_format(format);
      for (const auto& messages : conversations) {
        for (const bool generation : {false, true}) {
          hp::data::ChatRenderOptions options = with_tools();
          options.add_generation_prompt = generation;
          Json msgs = Json::array();
          for (const auto& m : messages) msgs.push_back(hf_message(m));
          cases.push_back({{"template", t.jinja()}, {"messages", msgs}, {"add_generation_prompt", generation}, {"tools", tools},
                           {"date_string", "26 Jul 2024"}});
          expected.push_back(t.render(messages, options));
        }
      }
    }
  }
  const std::string in = ::testing::TempDir() + "hp_tool_jinja_cases.json", out = ::testing::TempDir() + "hp_tool_jinja_out.json";
  std::ofstream(in) << cases.dump();
  const auto run = hp::testing::run_subprocess({"/usr/bin/python3", HP_SOURCE_DIR "/tests/support/render_jinja.py", in, out});
  ASSERT_EQ(run.exit_code, 0) << run.output << "(scripts/setup.sh installs python3-jinja2)";
  const auto rendered = nlohmann::json::parse(std::ifstream(out)).get<std::vector<std::string>>();
  ASSERT_EQ(rendered.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(rendered[i], expected[i]) << cases[i]["messages"].dump();
}

TEST(ToolCalls, ConfigKeyReachesTheTemplate) {
  const std::string yaml = hp::testing::write_text_file(::testing::TempDir() + "hp_tools_cfg/cfg.yaml",
                                 "model_name_or_path: qwen3-debug\ntokenizer: " HP_SOURCE_DIR "/examples/tokenizer\n"
                                 "dataset: glaive_toolcall_en_demo\ntemplate: qwen3_nothink\ntool_format: llama3\noutput_dir: /tmp/x\n");
  const auto config = hp::train::load_train_config(yaml, {});
  ASSERT_TRUE(config.tool_format);
  const auto tokenizer = hp::data::Tokenizer::from_file(HP_SOURCE_DIR "/examples/tokenizer");
  EXPECT_EQ(hp::train::chat_template_for(config, tokenizer).tool_format(), "llama3");
  EXPECT_FALSE(hp::train::load_train_config(yaml, {"tool_format=null"}).tool_format);
  EXPECT_NE(hp::testing::user_error_of([&] { hp::train::load_train_config(yaml, {"tool_format=mistral"}); }).find("tool_format: 'mistral' is not allowed; expected default | llama3 | qwen"),
            std::string::npos);
}

// LlamaFactory's glaive records train from the command line; a bad tool record stops the run
// with exit code 2 and its file:line.
TEST(ToolCalls, GlaiveRecordsTrainFromTheCommandLine) {
  const std::string dir = ::testing::TempDir() + "hp_tools_train";
  fs::remove_all(dir);
  const std::string yaml = hp::testing::write_text_file(dir + "/cfg.yaml",
                                 "model_name_or_path: qwen3-debug\ntokenizer: " HP_SOURCE_DIR "/examples/tokenizer\n"
                                 "dataset: glaive_toolcall_en_demo\ndataset_dir: " + kLlamaFactoryData + "\n"
                                 "template: qwen3_nothink\ncutoff_len: 2048\nper_device_train_batch_size: 2\nmax_steps: 2\n"
                                 "logging_steps: 1\noutput_dir: " + dir + "/out\n");
  const auto run = hp::testing::run_subprocess({HP_CLI_PATH, "train", yaml}, {std::chrono::seconds(300)});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("5 conversations -> 5 rows"), std::string::npos) << run.output;  // none cut to nothing
  std::ifstream log(dir + "/out/trainer_log.jsonl");
  int lines = 0;
  for (std::string line; std::getline(log, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) {
      ++lines;
      EXPECT_TRUE(std::isfinite(j["loss"].get<double>())) << line;
    }
  }
  EXPECT_EQ(lines, 2) << run.output;
  // The exported chat template carries the tool rendering.
  const auto tokenizer_config = nlohmann::json::parse(std::ifstream(dir + "/out/tokenizer_config.json"));
  EXPECT_NE(tokenizer_config.value("chat_template", "").find("<tool_response>"), std::string::npos);

  hp::testing::write_text_file(dir + "/data/dataset_info.json", R"({"bad": {"file_name": "bad.jsonl", "formatting": "sharegpt", "columns": {"tools": "tools"}}})");
  hp::testing::write_text_file(dir + "/data/bad.jsonl", R"({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}], "tools": "not json"})" "\n");
  const auto bad = hp::testing::run_subprocess({HP_CLI_PATH, "train", yaml, "dataset=bad", "dataset_dir=" + dir + "/data",
                                                "output_dir=" + dir + "/bad_out"},
                                               {std::chrono::seconds(120)});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find(dir + "/data/bad.jsonl:1: \"tools\": tools is not valid JSON"), std::string::npos) << bad.output;
}
