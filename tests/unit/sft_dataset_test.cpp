// alpaca and sharegpt records into conversations; every bad record named by file:line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "hyperparallel/data/dataset_registry.h"
#include "hyperparallel/data/sft_dataset.h"
#include "hyperparallel/data/synthetic_sft.h"
#include "hyperparallel/platform/user_error.h"

namespace hp = hyperparallel;
using hp::data::BadRecordPolicy;
using hp::data::DatasetFormat;

namespace {
std::string write(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  return path;
}
}  // namespace

TEST(SftDataset, AlpacaRecordsBecomeConversations) {
  const std::string path = write("a.jsonl",
                                 R"({"instruction": "Add", "input": "2 and 3", "output": "5"})" "\n"
                                 R"({"instruction": "Hi", "output": "Hello", "system": "Be brief.", "history": [["q", "a"]]})" "\n");
  const auto data = hp::data::load_sft_file(path, DatasetFormat::kAlpaca);
  ASSERT_EQ(data.size(), 2u);
  ASSERT_EQ(data[0].messages.size(), 2u);
  EXPECT_EQ(data[0].messages[0].content, "Add\n2 and 3");
  EXPECT_EQ(data[0].messages[1].content, "5");
  EXPECT_EQ(data[0].source, path + ":1");
  ASSERT_EQ(data[1].messages.size(), 5u);
  EXPECT_EQ(data[1].messages[0].role, "system");
  EXPECT_EQ(data[1].messages[1].content, "q");
  EXPECT_EQ(data[1].messages[4].content, "Hello");
}

TEST(SftDataset, SharegptInBothSpellingsAndAsAJsonArray) {
  const std::string path = write("s.json", R"([
    {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}], "system": "S"},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                  {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}
  ])");
  const auto data = hp::data::load_sft_file(path, DatasetFormat::kSharegpt);
  ASSERT_EQ(data.size(), 2u);
  EXPECT_EQ(data[0].messages.size(), 3u);
  EXPECT_EQ(data[0].messages[0].role, "system");
  EXPECT_EQ(data[0].messages[2].role, "assistant");
  EXPECT_EQ(data[1].messages[3].content, "d");
  EXPECT_EQ(data[1].source, path + "[#1]");
}

TEST(SftDataset, BadRecordsStopOrAreSkippedAndListed) {
  const std::string path = write("bad.jsonl",
                                 R"({"instruction": "ok", "output": "fine"})" "\n"
                                 R"({"instruction": "no output"})" "\n"
                                 "{not json\n"
                                 "\n"
                                 R"({"instruction": 7, "output": "x"})" "\n"
                                 R"({"instruction": "ok2", "output": "fine2"})" "\n");
  try {
    hp::data::load_sft_file(path, DatasetFormat::kAlpaca);
    FAIL() << "no error";
  } catch (const hp::UserError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":2: missing \"output\""), std::string::npos) << e.what();
  }
  hp::data::SftLoadOptions skip;
  skip.on_bad_record = BadRecordPolicy::kSkip;
  hp::data::SftLoadReport report;
  const auto data = hp::data::load_sft_file(path, DatasetFormat::kAlpaca, skip, &report);
  ASSERT_EQ(data.size(), 2u);
  EXPECT_EQ(data[1].source, path + ":6");
  ASSERT_EQ(report.skipped.size(), 3u);
  EXPECT_NE(report.skipped[1].find(path + ":3: not valid JSON"), std::string::npos) << report.skipped[1];
  EXPECT_NE(report.skipped[2].find(path + ":5: \"instruction\" must be a string"), std::string::npos) << report.skipped[2];
  skip.max_samples = 1;
  EXPECT_EQ(hp::data::load_sft_file(path, DatasetFormat::kAlpaca, skip).size(), 1u);

  const std::string turns = write("turns.jsonl",
                                  R"({"conversations": [{"from": "gpt", "value": "first"}, {"from": "human", "value": "x"}]})" "\n"
                                  R"({"conversations": [{"from": "human", "value": "x"}]})" "\n"
                                  R"({"conversations": [{"from": "robot", "value": "x"}]})" "\n");
  hp::data::SftLoadReport turn_report;
  EXPECT_TRUE(hp::data::load_sft_file(turns, DatasetFormat::kSharegpt, {std::nullopt, BadRecordPolicy::kSkip, {}}, &turn_report).empty());
  ASSERT_EQ(turn_report.skipped.size(), 3u);
  EXPECT_NE(turn_report.skipped[0].find("turn 0 is assistant, expected user or observation"), std::string::npos);
  EXPECT_NE(turn_report.skipped[1].find("must end with an assistant turn"), std::string::npos);
  EXPECT_NE(turn_report.skipped[2].find("unknown role 'robot'"), std::string::npos);
  EXPECT_THROW(hp::data::parse_dataset_format("oasst"), hp::UserError);
  EXPECT_THROW(hp::data::load_sft_file(write("x.json", "{}"), DatasetFormat::kAlpaca), hp::UserError);
}

TEST(SftDataset, DatasetInfoRenamesColumnsAndTagsAndMixesDatasets) {
  const std::string dir = testing::TempDir() + "/registry";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/parts");
  write("registry/dataset_info.json", R"({
    "qa": {"file_name": "qa.jsonl", "columns": {"prompt": "question", "response": "answer"}},
    "chats": {"file_name": "parts", "formatting": "sharegpt",
              "columns": {"messages": "turns"},
              "tags": {"role_tag": "who", "content_tag": "text", "user_tag": "me", "assistant_tag": "bot"}},
    "hub": {"hf_hub_url": "someone/data"},
    "typo": {"file_name": "qa.jsonl", "colums": {}}
  })");
  write("registry/qa.jsonl", R"({"question": "q1", "answer": "a1"})" "\n" R"({"question": "q2", "answer": "a2"})" "\n");
  write("registry/parts/b.jsonl", R"({"turns": [{"who": "me", "text": "u2"}, {"who": "bot", "text": "b2"}]})" "\n");
  write("registry/parts/a.json", R"([{"turns": [{"who": "me", "text": "u1"}, {"who": "bot", "text": "b1"}]}])");
  const auto data = hp::data::load_datasets("qa, chats", dir);
  ASSERT_EQ(data.size(), 4u);
  EXPECT_EQ(data[1].messages[1].content, "a2");
  EXPECT_EQ(data[2].messages[0].content, "u1");  // files of a folder in name order
  EXPECT_EQ(data[3].messages[1].content, "b2");
  hp::data::SftLoadOptions two;
  two.max_samples = 1;
  EXPECT_EQ(hp::data::load_datasets("qa,chats", dir, two).size(), 2u);  // per dataset
  const auto error_of = [&](const std::string& names) {
    try {
      hp::data::load_datasets(names, dir);
    } catch (const hp::UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("qa,chat").find("dataset 'chat' is neither built in nor in"), std::string::npos);
  EXPECT_NE(error_of("qa,chat").find("did you mean 'chats'?"), std::string::npos);
  EXPECT_NE(error_of("hub").find("nothing is downloaded here"), std::string::npos);
  EXPECT_NE(error_of("typo").find("unknown field \"colums\" (did you mean 'columns'?)"), std::string::npos);
  EXPECT_NE(error_of("qa,").find("empty name"), std::string::npos);
  write("registry/parts/c.jsonl", R"({"turns": [{"who": "human", "text": "u"}, {"who": "bot", "text": "b"}]})" "\n");
  EXPECT_NE(error_of("chats").find("c.jsonl:1: unknown role 'human' (the dataset's tags name user 'me', assistant 'bot', system 'system', observation 'observation', function 'function_call')"), std::string::npos);
  EXPECT_NE(hp::data::load_datasets("synthetic_reverse", "/nonexistent").size(), 0u);
}

// A dataset file by its path (dataset_file.*): formatting auto reads a record with turns as
// sharegpt and any other as alpaca; renamed turn fields keep the usual role names in either
// spelling; a missing file is named with its key.
TEST(SftDataset, ADatasetFileByPathReadsEachRecordByItsShape) {
  const std::string path = write("by_path.jsonl",
                                 R"({"dialog": [{"who": "human", "say": "Hi"}, {"who": "assistant", "say": "Yo"}]})" "\n"
                                 R"({"instruction": "Add", "input": "1 2", "output": "3"})" "\n");
  hp::data::DatasetFile file;
  file.path = path;
  file.column = "dialog";
  file.role_tag = "who";
  file.content_tag = "say";
  const auto data = hp::data::load_dataset_file(file);
  ASSERT_EQ(data.size(), 2u);
  EXPECT_EQ(data[0].messages[0].role, "user");
  EXPECT_EQ(data[0].messages[1].role, "assistant");
  EXPECT_EQ(data[0].messages[1].content, "Yo");
  EXPECT_EQ(data[1].messages[0].content, "Add\n1 2");
  EXPECT_EQ(data[1].source, path + ":2");
  file.formatting = "sharegpt";  // the alpaca record is then a bad one
  try {
    hp::data::load_dataset_file(file);
    ADD_FAILURE() << "an alpaca record read as sharegpt";
  } catch (const hp::UserError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":2"), std::string::npos) << e.what();
  }
  file.path = testing::TempDir() + "/no_such.jsonl";
  try {
    hp::data::load_dataset_file(file);
    ADD_FAILURE() << "a missing file was read";
  } catch (const hp::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("dataset_file.path: file " + file.path + " does not exist"), std::string::npos) << e.what();
  }
}

TEST(SftDataset, SyntheticDatasetsAreDeterministicWithDisjointHeldOutPrompts) {
  for (const auto& name : hp::data::synthetic_dataset_names()) {
    const auto a = hp::data::make_synthetic_dataset(name, 3000, 150, 0);
    const auto b = hp::data::make_synthetic_dataset(name, 3000, 150, 0);
    ASSERT_EQ(a.train.size(), 3000u);
    ASSERT_EQ(a.heldout.size(), 150u);
    std::set<std::string> train_prompts;
    for (size_t i = 0; i < a.train.size(); ++i) {
      EXPECT_EQ(a.train[i].messages[1].content, b.train[i].messages[1].content);
      train_prompts.insert(a.train[i].messages[0].content);
    }
    EXPECT_GT(train_prompts.size(), 1000u) << name;
    for (const auto& c : a.heldout) EXPECT_FALSE(train_prompts.count(c.messages[0].content)) << c.messages[0].content;
  }
  const auto r = hp::data::make_synthetic_dataset("synthetic_reverse", 1, 0, 5).train[0];
  const std::string prompt = r.messages[0].content, answer = r.messages[1].content;
  ASSERT_EQ(prompt.rfind("Reverse the words: ", 0), 0u);
  std::vector<std::string> words;
  std::istringstream in(prompt.substr(19));
  for (std::string w; in >> w;) words.push_back(w);
  std::string reversed;
  for (auto it = words.rbegin(); it != words.rend(); ++it) reversed += (reversed.empty() ? "" : " ") + *it;
  EXPECT_EQ(answer, reversed);
  const auto sum = hp::data::make_synthetic_dataset("synthetic_addition", 1, 0, 5).train[0];
  int a = 0, b = 0;
  ASSERT_EQ(std::sscanf(sum.messages[0].content.c_str(), "What is %d + %d?", &a, &b), 2);
  EXPECT_EQ(sum.messages[1].content, std::to_string(a + b));
  EXPECT_THROW(hp::data::make_synthetic_dataset("synthetic_revers"), hp::UserError);
}
