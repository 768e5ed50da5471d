// Files a user points us at, made hostile: a FIFO in a file's place (open() would block
// forever), /dev/zero behind a symlink (a read that never ends), JSON nested 100 000 deep (a
// recursive parser's stack), a record too large to tokenize, and a trainer log line of the
// wrong types. Each is a one-line UserError naming the file (or a bad record), at once.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>

#include "hyperparallel/data/sft_dataset.h"
#include "hyperparallel/data/tokenizer.h"
#include "hyperparallel/io/safetensors.h"
#include "hyperparallel/io/user_files.h"
#include "hyperparallel/models/model_config.h"
#include "hyperparallel/platform/user_error.h"
#include "train/train_output.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "hp_hostile_" + name + "_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// The UserError `f` throws, within 5 s ("" when it returns).
std::string error_of(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    f();
  } catch (const hp::UserError& e) {
    message = e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  return message;
}

std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// Each loader, on a path that holds `make(path)`.
void expect_each_loader_refuses(const std::string& dir, const std::function<void(const std::string&)>& make,
                                const std::string& expected) {
  const std::string config_dir = dir + "/model";
  fs::create_directories(config_dir);
  make(config_dir + "/config.json");
  EXPECT_NE(error_of([&] { hp::models::load_model_config(config_dir); }).find(expected), std::string::npos) << "config.json";
  make(dir + "/tokenizer.json");
  EXPECT_NE(error_of([&] { hp::data::Tokenizer::from_file(dir + "/tokenizer.json"); }).find(expected), std::string::npos)
      << "tokenizer.json";
  make(dir + "/data.json");
  EXPECT_NE(error_of([&] { hp::data::load_sft_file(dir + "/data.json", hp::data::DatasetFormat::kAlpaca); }).find(expected),
            std::string::npos)
      << "dataset";
}

TEST(HostileFiles, AFifoInAFilesPlaceIsRefusedWithoutWaiting) {
  const std::string dir = fresh_dir("fifo");
  const auto fifo = [](const std::string& path) {
    fs::remove(path);
    ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  };
  expect_each_loader_refuses(dir, fifo, "is a FIFO; it must be a regular file");
  fifo(dir + "/model.safetensors");
  EXPECT_NE(error_of([&] { hp::io::SafetensorsFile f(dir + "/model.safetensors"); }).find("is not a regular file"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(HostileFiles, ADeviceBehindASymlinkIsRefused) {
  const std::string dir = fresh_dir("device");
  const auto zero = [](const std::string& path) {
    fs::remove(path);
    fs::create_symlink("/dev/zero", path);
  };
  expect_each_loader_refuses(dir, zero, "is a character device; it must be a regular file");
  fs::remove_all(dir);
}

TEST(HostileFiles, DeeplyNestedJsonIsRefusedBeforeParsing) {
  const std::string dir = fresh_dir("nested");
  expect_each_loader_refuses(
      dir, [](const std::string& path) { write(path, nested(100000)); }, "nests JSON deeper than 128 levels");
  // An unused config.json key nested deep is refused at load, not carried into every checkpoint.
  fs::create_directories(dir + "/model2");
  write(dir + "/model2/config.json", R"({"model_type": "qwen3", "unused": )" + nested(300000) + "}");
  EXPECT_NE(error_of([&] { hp::models::load_model_config(dir + "/model2"); }).find("nests JSON deeper than 128 levels"),
            std::string::npos);
  // A .jsonl record nested deep is one bad record (skipped under the skip policy), not a crash.
  write(dir + "/data.jsonl", R"({"instruction": "a", "output": "b"})" "\n" + nested(300000) + "\n");
  hp::data::SftLoadOptions skip;
  skip.on_bad_record = hp::data::BadRecordPolicy::kSkip;
  hp::data::SftLoadReport report;
  EXPECT_EQ(hp::data::load_sft_file(dir + "/data.jsonl", hp::data::DatasetFormat::kAlpaca, skip, &report).size(), 1u);
  ASSERT_EQ(report.skipped.size(), 1u);
  EXPECT_NE(report.skipped[0].find("data.jsonl:2: nests JSON deeper than 128 levels"), std::string::npos) << report.skipped[0];
  // Nesting inside strings does not count.
  EXPECT_TRUE(hp::io::json_nesting_within("[\"[[[[[[\"]", 10, 2));
  fs::remove_all(dir);
}

// One record of 17 MiB would cost gigabytes to tokenize before cutoff_len cuts it: it is a bad
// record (skipped under the skip policy, named under stop).
TEST(HostileFiles, AHugeRecordIsABadRecordNotAnOutOfMemory) {
  const std::string dir = fresh_dir("record");
  write(dir + "/data.jsonl", R"({"instruction": "a", "output": "b"})" "\n" R"({"instruction": ")" + std::string(17u << 20, 'x') +
                                 R"(", "output": "b"})" "\n");
  hp::data::SftLoadOptions skip;
  skip.on_bad_record = hp::data::BadRecordPolicy::kSkip;
  hp::data::SftLoadReport report;
  EXPECT_EQ(hp::data::load_sft_file(dir + "/data.jsonl", hp::data::DatasetFormat::kAlpaca, skip, &report).size(), 1u);
  ASSERT_EQ(report.skipped.size(), 1u);
  EXPECT_NE(report.skipped[0].find("data.jsonl:2: its text is 17825793 bytes; a record may hold at most 16777216"), std::string::npos)
      << report.skipped[0];
  EXPECT_NE(error_of([&] { hp::data::load_sft_file(dir + "/data.jsonl", hp::data::DatasetFormat::kAlpaca); }).find("data.jsonl:2: its text is"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(HostileFiles, AnOversizedFileIsRefusedBeforeReading) {
  const std::string dir = fresh_dir("size");
  write(dir + "/big.json", std::string(2048, ' '));
  EXPECT_NE(error_of([&] { hp::io::read_user_file(dir + "/big.json", 1024, "the thing"); })
                .find("the thing " + dir + "/big.json is 2048 bytes; at most 1024 are read for it"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(HostileFiles, ATrainerLogLineOfTheWrongTypesNamesTheFileAndLine) {
  const std::string dir = fresh_dir("log");
  write(dir + "/trainer_log.jsonl", "{\"step\": 1, \"loss\": 2.5}\n{\"step\": \"two\", \"loss\": 2.0}\n");
  const std::string e = error_of([&] { hyperparallel::train::TrainerLog log(dir, 2); });
  EXPECT_NE(e.find(dir + "/trainer_log.jsonl:2: 'step' must be an integer and 'loss' (or 'eval_loss') a number"), std::string::npos) << e;
  write(dir + "/trainer_log.jsonl", "{\"step\": 1, \"loss\": 2.5}\n" + nested(5000) + "\n");
  EXPECT_NE(error_of([&] { hyperparallel::train::TrainerLog log(dir, 2); }).find("trainer_log.jsonl:2 nests JSON deeper"),
            std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
