// Tokenized rows made once and shared: the compact row store and its file
// (data/token_rows.h), tokenizing in threads, the keyed cache and LlamaFactory's
// tokenized_path (src/train/tokenized_cache.h, train_data.h), and ranks of one machine
// tokenizing once.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hyperparallel/data/chat_template.h"
#include "hyperparallel/data/pretrain_samples.h"
#include "hyperparallel/data/token_rows.h"
#include "hyperparallel/train/train_config.h"
#include "support/multiprocess.h"
#include "support/subprocess.h"
#include "support/test_files.h"
#include "train/train_data.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;
using hp::data::TokenRows;
using hp::data::TrainingRow;

namespace {

const std::string kTokenizer = HP_SOURCE_DIR "/tests/fixtures/tokenizer/qwen3";

std::vector<hp::data::Conversation> conversations(int n) {
  std::vector<hp::data::Conversation> out;
  for (int i = 0; i < n; ++i) {
    const std::string words(static_cast<size_t>(1 + (i * 37) % 90), "abcdefgh "[i % 9]);
    out.push_back({{{"user", "Question " + std::to_string(i) + ": " + words}, {"assistant", "Answer " + std::to_string(i * i)}},
                   "chats.jsonl:" + std::to_string(i + 1)});
  }
  return out;
}

void expect_same_rows(const TokenRows& got, const std::vector<TrainingRow>& want) {
  ASSERT_EQ(got.size(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    const TrainingRow row = got.row(static_cast<int64_t>(i));
    EXPECT_EQ(row.input_ids, want[i].input_ids) << "row " << i;
    EXPECT_EQ(row.labels, want[i].labels) << "row " << i;
    EXPECT_EQ(row.position_ids, want[i].position_ids) << "row " << i;
    EXPECT_EQ(got.length(static_cast<int64_t>(i)), static_cast<int64_t>(want[i].input_ids.size()));
    EXPECT_EQ(got.label_tokens(static_cast<int64_t>(i)), hp::data::label_tokens(want[i]));
  }
}

std::string temp(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "hp_tokenized_" + name;
  if (!hp::testing::is_rank_process()) fs::remove_all(dir);
  return dir;
}

}  // namespace

// SFT rows (plain and packed) and pretraining blocks survive the store and its file exactly;
// a selection views rows in a new order; a row the store cannot represent is refused.
TEST(TokenRows, HoldSftPackedAndPretrainRowsExactlyThroughAFile) {
  const auto tokenizer = hp::data::Tokenizer::from_file(kTokenizer);
  const auto qwen3 = hp::data::ChatTemplate::named("qwen3");
  hp::data::SampleOptions options;
  options.cutoff_len = 48;
  const auto sft = hp::data::build_sft_rows(tokenizer, qwen3, conversations(40), options);
  const auto packed = hp::data::pack_rows(sft, 128);
  std::vector<hp::data::TextSample> texts;
  for (int i = 0; i < 30; ++i) texts.push_back({"Some text number " + std::to_string(i) + " with words.", "t.txt:" + std::to_string(i)});
  hp::data::PretrainOptions pt;
  pt.cutoff_len = 16;
  pt.eos_token = "<|endoftext|>";
  const auto blocks = hp::data::build_pretrain_rows(tokenizer, texts, pt);
  const std::string dir = temp("store");
  fs::create_directories(dir);
  for (const auto* rows : {&sft, &packed, &blocks}) {
    const TokenRows store = TokenRows::from_rows(*rows, "{\"note\": 1}");
    expect_same_rows(store, *rows);
    store.save(dir + "/rows.hprows");
    const TokenRows mapped = TokenRows::open(dir + "/rows.hprows");
    EXPECT_TRUE(mapped.mapped());
    EXPECT_EQ(mapped.meta(), "{\"note\": 1}");
    expect_same_rows(mapped, *rows);
    EXPECT_EQ(mapped.max_id(), store.max_id());
    const TokenRows picked = mapped.select({3, 0, 2});
    expect_same_rows(picked, {(*rows)[3], (*rows)[0], (*rows)[2]});
    picked.save(dir + "/picked.hprows");
    expect_same_rows(TokenRows::open(dir + "/picked.hprows"), {(*rows)[3], (*rows)[0], (*rows)[2]});
  }
  TrainingRow odd = sft[0];
  odd.labels[1] = odd.input_ids[1] + 1;  // a label that is not its token
  EXPECT_THROW(TokenRows::from_rows({odd}), std::logic_error);
  odd = sft[0];
  odd.position_ids[2] = 7;  // positions that neither count up nor restart
  EXPECT_THROW(TokenRows::from_rows({odd}), std::logic_error);
}

// A damaged or foreign file is a UserError naming it and the fix, never rows.
TEST(TokenRows, RefuseDamagedFilesByName) {
  const auto tokenizer = hp::data::Tokenizer::from_file(kTokenizer);
  const auto rows = hp::data::build_sft_rows(tokenizer, hp::data::ChatTemplate::named("qwen3"), conversations(5), {});
  const std::string dir = temp("damaged");
  fs::create_directories(dir);
  const std::string good = dir + "/good.hprows";
  TokenRows::from_rows(rows).save(good);
  const std::string bytes = hp::testing::read_text_file(good);
  const auto damaged = [&](const std::string& name, std::string content) {
    return hp::testing::user_error_of([&] { TokenRows::open(hp::testing::write_text_file(dir + "/" + name, content)); });
  };
  EXPECT_NE(damaged("short.hprows", bytes.substr(0, bytes.size() - 3)).find("short.hprows: not a usable tokenized-rows file"),
            std::string::npos);
  EXPECT_NE(damaged("tiny.hprows", "HPROWS").find("shorter than its header"), std::string::npos);
  EXPECT_NE(damaged("json.hprows", std::string(80, '{')).find("does not start with HPROWS"), std::string::npos);
  std::string negative = bytes;
  const size_t first_id = 64 + (rows.size() + 1) * 8;
  negative[first_id + 3] = '\xff';  // the first id's top byte: negative
  EXPECT_NE(damaged("negative.hprows", negative).find("negative id"), std::string::npos);
  std::string backwards = bytes;
  backwards[64 + 8] = '\xff';  // row 0's end offset: past its tokens
  EXPECT_NE(damaged("offsets.hprows", backwards).find("row offsets"), std::string::npos);
  EXPECT_NE(damaged("short.hprows", "").find("delete it so it is made again"), std::string::npos);
  // A FIFO would block a reader forever: refused by its kind before it is opened.
  ASSERT_EQ(::mkfifo((dir + "/fifo.hprows").c_str(), 0644), 0);
  EXPECT_NE(hp::testing::user_error_of([&] { TokenRows::open(dir + "/fifo.hprows"); }).find("is a FIFO; it must be a regular file"),
            std::string::npos);
}

// Threads change how fast rows are made, not which: the same rows and reports, and the
// error a single thread would meet first.
TEST(TokenRows, ThreadsMakeTheSameRowsAndTheSameFirstError) {
  const auto tokenizer = hp::data::Tokenizer::from_file(kTokenizer);
  const auto qwen3 = hp::data::ChatTemplate::named("qwen3");
  auto chats = conversations(300);
  hp::data::SampleOptions one, four;
  one.cutoff_len = four.cutoff_len = 24;
  four.threads = 4;
  hp::data::SampleReport one_report, four_report;
  const auto serial = hp::data::build_sft_rows(tokenizer, qwen3, chats, one, &one_report);
  const auto parallel = hp::data::build_sft_rows(tokenizer, qwen3, chats, four, &four_report);
  expect_same_rows(TokenRows::from_rows(parallel), serial);
  EXPECT_GT(one_report.truncated, 0);
  EXPECT_EQ(four_report.truncated, one_report.truncated);
  EXPECT_EQ(four_report.dropped, one_report.dropped);
  chats[250].messages[0].role = "robot";
  chats[90].messages[1].role = "narrator";
  const std::string first = hp::testing::user_error_of([&] { hp::data::build_sft_rows(tokenizer, qwen3, chats, one); });
  EXPECT_NE(first.find("chats.jsonl:91"), std::string::npos) << first;
  EXPECT_EQ(hp::testing::user_error_of([&] { hp::data::build_sft_rows(tokenizer, qwen3, chats, four); }), first);
}

namespace {

// A dataset folder with one sharegpt file of `n` chats; returns the folder.
std::string chat_folder(const std::string& dir, int n, const std::string& extra = "") {
  std::string lines;
  for (int i = 0; i < n; ++i) {
    lines += R"({"conversations": [{"from": "human", "value": "Tell me )" + std::to_string(i) + extra +
             R"("}, {"from": "gpt", "value": "It is )" + std::to_string(i * 3) + R"(."}]})" + "\n";
  }
  hp::testing::write_text_file(dir + "/chats.jsonl", lines);
  hp::testing::write_text_file(dir + "/dataset_info.json", R"({"chats": {"file_name": "chats.jsonl", "formatting": "sharegpt"}})");
  return dir;
}

hp::train::TrainConfig data_config(const std::string& data_dir, std::vector<std::string> more = {}) {
  std::vector<std::string> overrides = {"model_name_or_path=qwen3-debug", "tokenizer=" HP_SOURCE_DIR "/examples/tokenizer",
                                        "dataset=chats", "dataset_dir=" + data_dir, "template=qwen3", "cutoff_len=32",
                                        "output_dir=" + data_dir + "/out"};
  overrides.insert(overrides.end(), more.begin(), more.end());
  return hp::train::load_train_config("", overrides);
}

std::vector<TrainingRow> rows_of(const TokenRows& rows) {
  std::vector<TrainingRow> out;
  for (int64_t i = 0; i < rows.size(); ++i) out.push_back(rows.row(i));
  return out;
}

bool noted(const hp::train::TrainData& data, const std::string& text) {
  for (const auto& n : data.notes) {
    if (n.find(text) != std::string::npos) return true;
  }
  return false;
}

size_t entries(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ".hprows";
  return n;
}

}  // namespace

// The first run tokenizes and saves; the next with the same inputs maps the entry (same
// rows, same report); other data bytes, another cutoff or template make another entry;
// overwrite_cache makes it again; tokenized_cache_dir: none keeps rows in memory.
TEST(TokenizedCache, ASecondRunReadsTheRowsTheFirstSaved) {
  const std::string dir = temp("cache");
  const std::string cache = dir + "/cache";
  chat_folder(dir + "/data", 60);
  const auto config = data_config(dir + "/data", {"tokenized_cache_dir=" + cache});
  const hp::train::TrainData first = hp::train::prepare_train_data(config);
  EXPECT_TRUE(noted(first, "train data: saved to " + cache)) << ::testing::PrintToString(first.notes);
  EXPECT_TRUE(noted(first, "60 conversations tokenized"));
  EXPECT_TRUE(first.rows.mapped());
  const hp::train::TrainData second = hp::train::prepare_train_data(config);
  EXPECT_TRUE(noted(second, "train data: read from " + cache)) << ::testing::PrintToString(second.notes);
  EXPECT_FALSE(noted(second, "tokenized in"));
  expect_same_rows(second.rows, rows_of(first.rows));
  EXPECT_EQ(second.conversations, 60);
  EXPECT_EQ(second.label_tokens, first.label_tokens);
  EXPECT_EQ(entries(cache), 1u);

  hp::train::prepare_train_data(data_config(dir + "/data", {"tokenized_cache_dir=" + cache, "cutoff_len=16"}));
  EXPECT_EQ(entries(cache), 2u);
  hp::train::prepare_train_data(data_config(dir + "/data", {"tokenized_cache_dir=" + cache, "template=qwen"}));
  EXPECT_EQ(entries(cache), 3u);
  chat_folder(dir + "/data", 60, " please");  // same names, other bytes
  const auto edited = hp::train::prepare_train_data(config);
  EXPECT_TRUE(noted(edited, "saved to"));
  EXPECT_EQ(entries(cache), 4u);
  const auto again = hp::train::prepare_train_data(data_config(dir + "/data", {"tokenized_cache_dir=" + cache, "overwrite_cache=true"}));
  EXPECT_TRUE(noted(again, "train data: saved to")) << ::testing::PrintToString(again.notes);
  EXPECT_EQ(entries(cache), 4u);
  const auto memory = hp::train::prepare_train_data(data_config(dir + "/data", {"tokenized_cache_dir=none"}));
  EXPECT_FALSE(memory.rows.mapped());
  expect_same_rows(memory.rows, rows_of(edited.rows));

  // A damaged entry is made again, with a note.
  for (const auto& e : fs::directory_iterator(cache)) {
    if (e.path().extension() == ".hprows") fs::resize_file(e.path(), 70);
  }
  const auto repaired = hp::train::prepare_train_data(config);
  EXPECT_TRUE(noted(repaired, "tokenizing again")) << ::testing::PrintToString(repaired.notes);
  expect_same_rows(repaired.rows, rows_of(edited.rows));
}

// LlamaFactory's tokenized_path: the first run saves the rows there, later runs read them
// without the dataset (its keys and its files may be gone), val_size still splits them; a
// folder LlamaFactory saved is refused by name.
TEST(TokenizedCache, TokenizedPathSavesThenServesRunsWithoutTheData) {
  const std::string dir = temp("path");
  chat_folder(dir + "/data", 40);
  const std::string saved = dir + "/tokenized";
  const auto first = hp::train::prepare_train_data(data_config(dir + "/data", {"tokenized_path=" + saved, "val_size=0.25"}));
  EXPECT_TRUE(fs::exists(saved + "/train.hprows"));
  EXPECT_EQ(first.rows.size(), 30);
  EXPECT_EQ(first.eval_rows.size(), 10);
  fs::remove_all(dir + "/data");
  const auto later = hp::train::prepare_train_data(
      hp::train::load_train_config("", {"model_name_or_path=qwen3-debug", "tokenizer=" HP_SOURCE_DIR "/examples/tokenizer",
                                        "template=qwen3", "cutoff_len=16", "val_size=0.25", "tokenized_path=" + saved,
                                        "output_dir=" + dir + "/out"}));
  EXPECT_TRUE(noted(later, "train data: read from " + saved)) << ::testing::PrintToString(later.notes);
  EXPECT_TRUE(noted(later, "warning: tokenized_path " + saved + " was made with other cutoff_len"));
  expect_same_rows(later.rows, rows_of(first.rows));
  expect_same_rows(later.eval_rows, rows_of(first.eval_rows));

  const std::string arrow = dir + "/arrow";
  hp::testing::write_text_file(arrow + "/dataset_dict.json", R"({"splits": ["train"]})");
  EXPECT_NE(hp::testing::user_error_of([&] { hp::train::prepare_train_data(data_config(dir + "/none", {"tokenized_path=" + arrow})); })
                .find("holds a dataset saved by LlamaFactory (dataset_dict.json"),
            std::string::npos);
  EXPECT_NE(hp::testing::user_error_of([&] {
              hp::train::prepare_train_data(hp::train::load_train_config(
                  "", {"model_name_or_path=qwen3-debug", "tokenizer=" HP_SOURCE_DIR "/examples/tokenizer", "template=qwen3",
                       "tokenized_path=" + dir + "/empty", "output_dir=" + dir + "/out"}));
            }).find("holds no tokenized rows (train.hprows) yet, and no dataset is named"),
            std::string::npos);
}

// Three ranks of one machine start together on a cold cache: one tokenizes, the others map
// its file, and all hold the same rows.
TEST(TokenizedCache, RanksOfOneMachineTokenizeOnce) {
  const std::string dir = temp("ranks");
  if (!hp::testing::is_rank_process()) chat_folder(dir + "/data", 400);
  hp::testing::run_on_ranks(3, [&](hp::testing::RankContext& ctx) {
    const auto data = hp::train::prepare_train_data(data_config(dir + "/data", {"tokenized_cache_dir=" + dir + "/cache"}));
    EXPECT_TRUE(data.rows.mapped());
    at::Tensor built = at::tensor({noted(data, "saved to") ? 1.0 : 0.0, static_cast<double>(data.rows.total_tokens())}, at::kDouble);
    at::Tensor tokens = built.clone();
    ctx.world->all_reduce(built).wait();
    EXPECT_EQ(built[0].item<double>(), 1.0) << "exactly one rank tokenizes";
    EXPECT_EQ(built[1].item<double>(), 3 * tokens[1].item<double>()) << "every rank holds the same rows";
  });
}

// Through the command line, as a LlamaFactory user runs it: the first run tokenizes into
// tokenized_path and trains; the second trains from the folder alone (no dataset key, the data
// files gone) to the same losses; a LlamaFactory Arrow folder stops the run with exit code 2.
TEST(TokenizedCache, TrainingFromTokenizedPathMatchesTrainingFromTheData) {
  const std::string dir = temp("cli");
  chat_folder(dir + "/data", 64);
  const std::vector<std::string> common = {"model_name_or_path=qwen3-debug", "tokenizer=" HP_SOURCE_DIR "/examples/tokenizer",
                                           "template=qwen3", "cutoff_len=32", "max_steps=4", "logging_steps=1",
                                           "per_device_train_batch_size=4", "tokenized_path=" + dir + "/tokenized"};
  const auto train = [&](const std::string& out, std::vector<std::string> more) {
    std::vector<std::string> argv = {HP_CLI_PATH, "train"};
    argv.insert(argv.end(), common.begin(), common.end());
    argv.insert(argv.end(), more.begin(), more.end());
    argv.push_back("output_dir=" + out);
    return hp::testing::run_subprocess(argv, {std::chrono::seconds(180)});
  };
  const auto losses = [](const std::string& out) {
    std::vector<double> values;
    std::ifstream in(out + "/trainer_log.jsonl");
    for (std::string line; std::getline(in, line);) values.push_back(nlohmann::json::parse(line).at("loss").get<double>());
    return values;
  };
  const auto first = train(dir + "/out1", {"dataset=chats", "dataset_dir=" + dir + "/data"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("train data: saved to " + dir + "/tokenized/train.hprows"), std::string::npos) << first.output;
  fs::remove_all(dir + "/data");
  const auto second = train(dir + "/out2", {});
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("train data: read from " + dir + "/tokenized/train.hprows"), std::string::npos) << second.output;
  EXPECT_EQ(losses(dir + "/out2").size(), 4u);
  EXPECT_EQ(losses(dir + "/out2"), losses(dir + "/out1"));

  hp::testing::write_text_file(dir + "/arrow/dataset_dict.json", "{}");
  std::vector<std::string> argv = {HP_CLI_PATH, "train"};
  argv.insert(argv.end(), common.begin(), common.end());
  argv.back() = "tokenized_path=" + dir + "/arrow";
  argv.push_back("output_dir=" + dir + "/out3");
  const auto refused = hp::testing::run_subprocess(argv, {std::chrono::seconds(60)});
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("holds a dataset saved by LlamaFactory"), std::string::npos) << refused.output;
}
