// The output folder a run claims: never one of its inputs (the export would overwrite the
// model it reads), never another folder's contents unasked, and one run at a time — each a
// one-line exit 2 before anything is written, with the inputs untouched.
#include <gtest/gtest.h>
#include <sys/file.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "support/hf_folder.h"
#include "support/subprocess.h"

namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "hp_output_dir_" + name + "_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

hyperparallel::testing::SubprocessResult train(const std::string& model, const std::string& output_dir,
                                                const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {HP_CLI_PATH, "train", HP_SOURCE_DIR "/examples/demo_sft.yaml", "--model_name_or_path=" + model,
                                   "--output_dir=" + output_dir, "--max_steps=1", "--heldout_eval_samples=0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return hyperparallel::testing::run_subprocess(argv, {std::chrono::seconds(120)});
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(OutputDir, AnInputFolderIsNeverTheOutput) {
  const std::string root = fresh_dir("inputs");
  const std::string model = hyperparallel::testing::write_tiny_hf_folder(root + "/model");
  const std::string weights = bytes_of(model + "/model.safetensors");
  for (const auto& [out, words] : std::vector<std::pair<std::string, std::string>>{
           {model, " is model_name_or_path "}, {model + "/run", " is inside model_name_or_path "}, {root, " contains model_name_or_path "}}) {
    SCOPED_TRACE(out);
    const auto r = train(model, out, {"--overwrite_output_dir=true"});
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("output_dir " + out + words), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("pick a folder apart from its inputs"), std::string::npos) << r.output;
  }
  EXPECT_EQ(bytes_of(model + "/model.safetensors"), weights) << "the source weights changed";
  EXPECT_FALSE(fs::exists(model + "/run"));
  fs::remove_all(root);
}

TEST(OutputDir, AFolderWithOtherFilesIsOnlyUsedWhenAsked) {
  const std::string root = fresh_dir("other");
  std::ofstream(root + "/notes.txt") << "mine";
  const auto refused = train("qwen3-debug", root, {"--tokenizer=" HP_SOURCE_DIR "/examples/tokenizer", "--overwrite_output_dir=false"});
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("is not empty and holds no run of ours"), std::string::npos) << refused.output;
  EXPECT_FALSE(fs::exists(root + "/trainer_log.jsonl"));
  const auto asked = train("qwen3-debug", root, {"--tokenizer=" HP_SOURCE_DIR "/examples/tokenizer", "--overwrite_output_dir=true"});
  EXPECT_EQ(asked.exit_code, 0) << asked.output;
  EXPECT_EQ(bytes_of(root + "/notes.txt"), "mine");
  fs::remove_all(root);
}

TEST(OutputDir, OneRunAtATime) {
  const std::string root = fresh_dir("locked");
  // Another run holds the folder (here: this process, as a run's rank 0 would).
  const int fd = ::open((root + "/.hyperparallel.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
  const std::string pid = std::to_string(getpid());
  ASSERT_EQ(::write(fd, pid.data(), pid.size()), static_cast<ssize_t>(pid.size()));
  const auto second = train("qwen3-debug", root, {"--tokenizer=" HP_SOURCE_DIR "/examples/tokenizer"});
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_NE(second.output.find("is in use by another run (process " + pid + ")"), std::string::npos) << second.output;
  EXPECT_FALSE(fs::exists(root + "/trainer_log.jsonl"));
  ::close(fd);  // that run ends: the folder is free
  const auto next = train("qwen3-debug", root, {"--tokenizer=" HP_SOURCE_DIR "/examples/tokenizer"});
  EXPECT_EQ(next.exit_code, 0) << next.output;
  fs::remove_all(root);
}

}  // namespace
