// alpaca and sharegpt records into conversations; every bad record named by file:line.
#include <gtest/gtest.h>

#include <fstream>

#include "hyperparallel/data/sft_dataset.h"
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
  EXPECT_TRUE(hp::data::load_sft_file(turns, DatasetFormat::kSharegpt, {std::nullopt, BadRecordPolicy::kSkip}, &turn_report).empty());
  ASSERT_EQ(turn_report.skipped.size(), 3u);
  EXPECT_NE(turn_report.skipped[0].find("turn 0 is assistant, expected user"), std::string::npos);
  EXPECT_NE(turn_report.skipped[1].find("must end with an assistant turn"), std::string::npos);
  EXPECT_NE(turn_report.skipped[2].find("unknown role 'robot'"), std::string::npos);
  EXPECT_THROW(hp::data::parse_dataset_format("oasst"), hp::UserError);
  EXPECT_THROW(hp::data::load_sft_file(write("x.json", "{}"), DatasetFormat::kAlpaca), hp::UserError);
}
