// Chat templates against renders done by hand from the fixture tokenizer_config.json
// templates (qwen3, llama3) and the published Llama 2 / ChatML formats, and the token ids
// they give with the real tokenizers.
#include <gtest/gtest.h>

#include "hyperparallel/data/chat_template.h"
#include "hyperparallel/data/tokenizer.h"
#include "hyperparallel/platform/user_error.h"
#include "support/subprocess.h"

#include <fstream>
#include <nlohmann/json.hpp>

namespace hp = hyperparallel;
using hp::data::ChatMessage;
using hp::data::ChatTemplate;

namespace {
const std::string kFixtures = HP_SOURCE_DIR "/tests/fixtures/tokenizer";
const std::vector<ChatMessage> kConversation = {
    {"system", "You are helpful."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}, {"assistant", "4"}};
}  // namespace

TEST(ChatTemplate, Qwen3AddsTheEmptyThinkBlockAfterTheLastQuery) {
  const auto qwen3 = ChatTemplate::named("qwen3");
  EXPECT_EQ(qwen3.render(kConversation),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>\n");
  // Reasoning written into the content is split out; a historical turn loses it.
  const std::vector<ChatMessage> reasoning = {{"user", "a"},
                                              {"assistant", "<think>\nold\n</think>\n\nfirst"},
                                              {"user", "b"},
                                              {"assistant", "<think>\nwhy\n</think>\n\nsecond"}};
  EXPECT_EQ(qwen3.render(reasoning),
            "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nfirst<|im_end|>\n<|im_start|>user\nb<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nwhy\n</think>\n\nsecond<|im_end|>\n");
  hp::data::ChatRenderOptions prompt;
  prompt.add_generation_prompt = true;
  EXPECT_EQ(qwen3.render({{"user", "Hi"}}, prompt), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  prompt.enable_thinking = false;
  EXPECT_EQ(qwen3.render({{"user", "Hi"}}, prompt),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // Markers are single added tokens in the real tokenizer.
  const auto tokenizer = hp::data::Tokenizer::from_file(kFixtures + "/qwen3");
  const auto ids = tokenizer.encode(qwen3.render(kConversation));
  EXPECT_EQ(ids.front(), *tokenizer.token_to_id("<|im_start|>"));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *tokenizer.token_to_id("<think>")), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *tokenizer.token_to_id("<|im_end|>")), 5);
  EXPECT_EQ(tokenizer.decode(ids), qwen3.render(kConversation));
}

TEST(ChatTemplate, Llama3TrimsContentAndOpensTheAssistantTurn) {
  hp::data::ChatRenderOptions prompt;
  prompt.add_generation_prompt = true;
  const std::string text = ChatTemplate::named("llama3").render({{"system", "S "}, {"user", " Hi\n"}}, prompt);
  EXPECT_EQ(text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  const auto tokenizer = hp::data::Tokenizer::from_file(kFixtures + "/llama3");
  const auto ids = tokenizer.encode(text);
  EXPECT_EQ(ids.front(), *tokenizer.token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *tokenizer.token_to_id("<|eot_id|>")), 2);
}

TEST(ChatTemplate, ChatMLAndLlama2) {
  // qwen carries LlamaFactory's default system prompt; qwen3_nothink is plain ChatML.
  const std::string chat = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n";
  const std::string qwen_system = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n";
  EXPECT_EQ(ChatTemplate::named("qwen").render({{"user", "Hi"}, {"assistant", "Yo"}}), qwen_system + chat);
  EXPECT_EQ(ChatTemplate::named("qwen").render({{"system", ""}, {"user", "Hi"}, {"assistant", "Yo"}}), qwen_system + chat);
  EXPECT_EQ(ChatTemplate::named("qwen").render({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Yo"}}),
            "<|im_start|>system\nBe brief.<|im_end|>\n" + chat);
  EXPECT_EQ(ChatTemplate::named("qwen3_nothink").render({{"user", "Hi"}, {"assistant", "Yo"}}), chat);
  EXPECT_EQ(ChatTemplate::named("qwen").with_default_system("").render({{"user", "Hi"}, {"assistant", "Yo"}}), chat);
  EXPECT_EQ(ChatTemplate::named("qwen3_nothink").with_default_system("Be kind.").render({{"user", "Hi"}, {"assistant", "Yo"}}),
            "<|im_start|>system\nBe kind.<|im_end|>\n" + chat);
  // The response spans move with the inserted system block.
  const auto spans = ChatTemplate::named("qwen").render_with_spans({{"user", "Hi"}, {"assistant", "Yo"}});
  ASSERT_EQ(spans.responses.size(), 1u);
  EXPECT_EQ(spans.text.substr(spans.responses[0].begin, spans.responses[0].end - spans.responses[0].begin), "Yo<|im_end|>");
  EXPECT_EQ(ChatTemplate::named("llama2").render(kConversation),
            "<s>[INST] <<SYS>>\nYou are helpful.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] 2+2? [/INST] 4 </s>");
  const auto tokenizer = hp::data::Tokenizer::from_file(kFixtures + "/mistral");
  const auto ids = tokenizer.encode(ChatTemplate::named("llama2").render(kConversation));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 2);  // <s>
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 2);  // </s>
}

TEST(ChatTemplate, MistakesAreNamed) {
  try {
    ChatTemplate::named("vicuna");
    FAIL();
  } catch (const hp::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("known: default, llama2, llama3, qwen, qwen3"), std::string::npos);
  }
  EXPECT_THROW(ChatTemplate::named("qwen3").render({{"user", "a"}, {"tool", "b"}}), hp::UserError);
  EXPECT_THROW(ChatTemplate::named("qwen3").render({{"user", "a"}, {"system", "late"}}), hp::UserError);
  EXPECT_THROW(ChatTemplate::named("llama2").render({{"assistant", "first"}}), hp::UserError);
}

TEST(ChatTemplate, DefaultIsLlamaFactorysPlainTextTemplate) {
  const auto plain = ChatTemplate::named("default", "</s>");
  EXPECT_EQ(plain.render(kConversation),
            "System: You are helpful.</s>\nHuman: Hi</s>\nAssistant:Hello!</s>\nHuman: 2+2?</s>\nAssistant:4</s>\n");
  hp::data::ChatRenderOptions prompt;
  prompt.add_generation_prompt = true;
  EXPECT_EQ(plain.render({{"user", "Hi"}}, prompt), "Human: Hi</s>\nAssistant:");
  try {
    ChatTemplate::named("default");
    FAIL() << "no eos token";
  } catch (const hp::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("eos_token in tokenizer_config.json"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, SpansMarkEachAssistantResponseInTheRenderedText) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> expected = {
      {"qwen3", {"Hello!<|im_end|>", "<think>\n\n</think>\n\n4<|im_end|>"}},
      {"qwen", {"Hello!<|im_end|>", "4<|im_end|>"}},
      {"llama3", {"Hello!<|eot_id|>", "4<|eot_id|>"}},
      {"llama2", {"Hello! </s>", "4 </s>"}},
      {"default", {"Hello!</s>", "4</s>"}}};
  for (const auto& [name, responses] : expected) {
    const auto t = ChatTemplate::named(name, "</s>");
    const auto chat = t.render_with_spans(kConversation);
    EXPECT_EQ(chat.text, t.render(kConversation)) << name;
    std::vector<std::string> got;
    for (const auto& span : chat.responses) got.push_back(chat.text.substr(span.begin, span.end - span.begin));
    EXPECT_EQ(got, responses) << name;
  }
}

// The Jinja an exported model carries renders, under transformers' Jinja settings, exactly
// what render() gives: every template, with and without (default) system prompts, multi-turn,
// with and without a generation prompt.
TEST(ChatTemplate, JinjaRendersWhatRenderDoes) {
  const std::vector<std::vector<ChatMessage>> conversations = {
      {{"user", "Hi"}, {"assistant", "Hello!"}},
      {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", " 2+2? "}, {"assistant", "4"}},
      {{"system", ""}, {"user", "It's \"quoted\" \\ and\nmultiline"}},
      {{"user", "Think"}, {"assistant", "<think>\nhmm\n</think>\n\nDone."}, {"user", "Again"}},
  };
  nlohmann::json cases = nlohmann::json::array();
  std::vector<std::string> expected;
  for (const auto& name : ChatTemplate::names()) {
    for (const std::string system : {"<keep>", "", "Be kind, 'really'."}) {
      ChatTemplate t = ChatTemplate::named(name, "</s>");
      if (system != "<keep>") t = t.with_default_system(system);
      for (const auto& messages : conversations) {
        for (const bool generation : {false, true}) {
          if (name == "llama2" && messages.size() % 2 == (messages[0].role == "system" ? 0u : 1u) && !generation) continue;
          hp::data::ChatRenderOptions options;
          options.add_generation_prompt = generation;
          nlohmann::json msgs = nlohmann::json::array();
          for (const auto& m : messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
          std::string text;
          try {
            text = t.render(messages, options);
          } catch (const hp::UserError&) {
            continue;  // llama2 refuses non-alternating turns; the Jinja raises too
          }
          cases.push_back({{"template", t.jinja()}, {"messages", msgs}, {"add_generation_prompt", generation}});
          expected.push_back(text);
          if (name == "qwen3" && generation) {
            options.enable_thinking = false;
            cases.push_back({{"template", t.jinja()}, {"messages", msgs}, {"add_generation_prompt", true}, {"enable_thinking", false}});
            expected.push_back(t.render(messages, options));
          }
        }
      }
    }
  }
  const std::string in = ::testing::TempDir() + "hp_jinja_cases.json", out = ::testing::TempDir() + "hp_jinja_out.json";
  std::ofstream(in) << cases.dump();
  const auto run = hp::testing::run_subprocess({"/usr/bin/python3", HP_SOURCE_DIR "/tests/support/render_jinja.py", in, out});
  ASSERT_EQ(run.exit_code, 0) << run.output << "(scripts/setup.sh installs python3-jinja2)";
  const auto rendered = nlohmann::json::parse(std::ifstream(out)).get<std::vector<std::string>>();
  ASSERT_EQ(rendered.size(), expected.size());
  EXPECT_GE(expected.size(), 100u);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(rendered[i], expected[i]) << cases[i].dump();
}
