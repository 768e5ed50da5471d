// The tokenizer against Hugging Face's Rust `tokenizers` on 242 hard strings for each of
// qwen3 (byte-level BPE, NFC), llama3 (byte-level BPE, ignore_merges) and mistral
// (SentencePiece-style BPE with byte fallback): ids and decodes must match exactly
// (tests/fixtures/tokenizer/README.md).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hyperparallel/data/tokenizer.h"
#include "hyperparallel/platform/user_error.h"
#include "support/subprocess.h"

namespace hp = hyperparallel;

namespace {

const std::string kFixtures = HP_SOURCE_DIR "/tests/fixtures/tokenizer";

// Records are split on '\n' only: U+0085, U+2028 and U+2029 appear raw inside strings.
std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<nlohmann::json> records;
  std::string all = text.str();
  size_t start = 0;
  for (size_t nl; (nl = all.find('\n', start)) != std::string::npos; start = nl + 1) {
    records.push_back(nlohmann::json::parse(all.substr(start, nl - start)));
  }
  return records;
}

void expect_matches_reference(const std::string& name) {
  const auto tokenizer = hp::data::Tokenizer::from_file(kFixtures + "/" + name);
  const auto expected = read_jsonl(kFixtures + "/expected/" + name + ".expected.jsonl");
  ASSERT_EQ(expected.size(), 242u);
  int id_mismatches = 0, decode_mismatches = 0;
  for (size_t k = 0; k < expected.size(); ++k) {
    const std::string text = expected[k]["text"].get<std::string>();
    const auto want = expected[k]["ids"].get<std::vector<int64_t>>();
    const auto got = tokenizer.encode(text);
    if (got != want && ++id_mismatches <= 5) {
      ADD_FAILURE() << name << " line " << k + 1 << ": ids differ for " << nlohmann::json(text).dump();
    }
    const std::string decoded = tokenizer.decode(want);
    if (decoded != expected[k]["decoded"].get<std::string>() && ++decode_mismatches <= 5) {
      ADD_FAILURE() << name << " line " << k + 1 << ": decode differs: " << nlohmann::json(decoded).dump() << " vs "
                    << expected[k]["decoded"].dump();
    }
  }
  EXPECT_EQ(id_mismatches, 0) << name;
  EXPECT_EQ(decode_mismatches, 0) << name;
}

}  // namespace

TEST(Tokenizer, Qwen3MatchesTheReference) { expect_matches_reference("qwen3"); }
TEST(Tokenizer, Llama3MatchesTheReference) { expect_matches_reference("llama3"); }
TEST(Tokenizer, MistralMatchesTheReference) { expect_matches_reference("mistral"); }

TEST(Tokenizer, MalformedFilesFailWithTheFileNamed) {
  const std::string dir = testing::TempDir();
  const auto error_of = [&](const std::string& json) {
    const std::string path = dir + "/tokenizer.json";
    std::ofstream(path, std::ios::trunc) << json;
    try {
      hp::data::Tokenizer::from_file(path);
    } catch (const hp::UserError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_of("{\"model\": ").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("{}").find("malformed tokenizer.json"), std::string::npos);
  EXPECT_NE(error_of(R"({"model": {"type": "Unigram", "vocab": []}})").find("'Unigram' is not supported"), std::string::npos);
  EXPECT_NE(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})").find("not in the vocabulary"),
            std::string::npos);
  const std::string bpe = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
  EXPECT_NE(error_of("{" + bpe + R"(, "normalizer": {"type": "NFKD"}})").find("normalizer 'NFKD' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of("{" + bpe + R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(["}, "behavior": "Isolated"}})")
                .find("regex does not compile"),
            std::string::npos);
  // A float id (found by the fuzzer: converting 2.33e45 to int64 is undefined) or a negative one.
  EXPECT_NE(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 2.33e45}, "merges": []}})")
                .find("vocab entry 'a' is 2.33e+45, not a token id"),
            std::string::npos);
  EXPECT_NE(error_of("{" + bpe + R"(, "added_tokens": [{"id": -4, "content": "<s>"}]})").find("added token id is -4, not a token id"),
            std::string::npos);
  // An id far beyond any vocabulary would size the tables: refused before allocating.
  EXPECT_NE(error_of("{" + bpe + R"(, "added_tokens": [{"id": 300000000, "content": "<s>"}]})")
                .find("added token id is 300000000, not a token id (an integer in [0, 16777215])"),
            std::string::npos);
  EXPECT_THROW(hp::data::Tokenizer::from_file(dir + "/nonexistent.json"), hp::UserError);
  // A minimal valid one: merges apply; without a decoder, decode joins tokens with spaces.
  std::ofstream(dir + "/tokenizer.json", std::ios::trunc) << "{" + bpe + "}";
  const auto tokenizer = hp::data::Tokenizer::from_file(dir + "/tokenizer.json");
  EXPECT_EQ(tokenizer.encode("abab"), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(tokenizer.decode({2, 0}), "ab a");
}

TEST(Tokenizer, TokenizeCommandEncodesAndDecodesLines) {
  // Every corpus text as a JSON string per line through `hyperparallel tokenize --jsonl`.
  const auto expected = read_jsonl(kFixtures + "/expected/mistral.expected.jsonl");
  const std::string input = testing::TempDir() + "/tokenize_input.jsonl";
  {
    std::ofstream out(input, std::ios::trunc);
    for (const auto& record : expected) out << record["text"].dump() << "\n";
  }
  const std::string model = kFixtures + "/mistral";
  auto result = hp::testing::run_subprocess(
      {"/bin/sh", "-c", std::string(HP_CLI_PATH) + " tokenize --model " + model + " --jsonl < " + input});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::istringstream lines(result.output);
  std::string line;
  size_t k = 0;
  for (; std::getline(lines, line) && k < expected.size(); ++k) {
    EXPECT_EQ(nlohmann::json::parse(line), expected[k]["ids"]) << "line " << k + 1;
  }
  EXPECT_EQ(k, expected.size());
  result = hp::testing::run_subprocess(
      {"/bin/sh", "-c", "echo '[1, 22557, 1526]' | " + std::string(HP_CLI_PATH) + " tokenize --model " + model + " --decode"});
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_NE(result.output.find("<s> Hello world"), std::string::npos) << result.output;
  result = hp::testing::run_subprocess(
      {"/bin/sh", "-c", "echo '[1, 99999]' | " + std::string(HP_CLI_PATH) + " tokenize --model " + model + " --decode"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.output.find("stdin line 1: 99999 is not a token id"), std::string::npos) << result.output;
  result = hp::testing::run_subprocess({HP_CLI_PATH, "tokenize", "--model", "/nonexistent"});
  EXPECT_EQ(result.exit_code, 2);
}
