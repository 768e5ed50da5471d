// What a job may touch: a training run (with checkpoints, a resume and the loss plot), an
// export and a generation write nothing outside their output folders — not in the inputs,
// the working directory, HOME or TMPDIR — and nothing a model folder ships is executed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "support/hf_folder.h"
#include "support/subprocess.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;

namespace {

struct Entry {
  bool directory = false;
  uintmax_t size = 0;
  fs::file_time_type modified;
  bool operator==(const Entry& o) const {
    return directory == o.directory && (directory || (size == o.size && modified == o.modified));
  }
};

// Every path under `root` with its size and modification time (files) or just its existence
// (folders, whose times change when entries are added).
std::map<std::string, Entry> snapshot(const fs::path& root) {
  std::map<std::string, Entry> entries;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    Entry s;
    s.directory = e.is_directory();
    if (!s.directory) {
      s.size = e.file_size();
      s.modified = e.last_write_time();
    }
    entries[e.path().string()] = s;
  }
  return entries;
}

bool under(const std::string& path, const std::vector<std::string>& allowed) {
  for (const auto& a : allowed) {
    if (path == a || path.rfind(a + "/", 0) == 0) return true;
  }
  return false;
}

}  // namespace

TEST(Security, AJobWritesOnlyInsideItsOutputFoldersAndExecutesNothing) {
  const fs::path root = ::testing::TempDir() + "hp_security_writes";
  fs::remove_all(root);
  for (const char* d : {"inputs", "home", "tmp", "cwd"}) fs::create_directories(root / d);
  const std::string model = hp::testing::write_tiny_hf_folder((root / "inputs/model").string());
  // A folder that asks for remote code: config.json's auto_map names a Python module that
  // would leave a marker if anything ran it.
  nlohmann::json config = nlohmann::json::parse(std::ifstream(model + "/config.json"));
  config["auto_map"] = {{"AutoModelForCausalLM", "modeling_evil.EvilForCausalLM"}};
  std::ofstream(model + "/config.json") << config.dump(2);
  std::ofstream(model + "/modeling_evil.py") << "open('" << (root / "EXECUTED").string() << "', 'w').write('ran')\n";
  fs::copy(HP_SOURCE_DIR "/examples/data", root / "inputs/data");
  fs::copy(HP_SOURCE_DIR "/examples/llamafactory_sft.yaml", root / "inputs/train.yaml");

  const std::string out = (root / "out").string(), exported = (root / "exported").string();
  hp::testing::SubprocessOptions options{std::chrono::seconds(180), {{"HOME", (root / "home").string()}, {"TMPDIR", (root / "tmp").string()}}};
  options.working_dir = (root / "cwd").string();
  const auto train = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {HP_CLI_PATH, "train", (root / "inputs/train.yaml").string(), "--model_name_or_path=" + model,
                                     "--dataset_dir=" + (root / "inputs/data").string(), "--output_dir=" + out,
                                     "--nproc_per_node=2", "--save_steps=2", "--logging_steps=1", "--trust_remote_code=true"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return hp::testing::run_subprocess(argv, options);
  };
  const auto before = snapshot(root);

  const auto first = train({"--max_steps=4"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto resumed = train({"--max_steps=6", "--resume_from_checkpoint=latest", "--overwrite_output_dir=false"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto exporting = hp::testing::run_subprocess({HP_CLI_PATH, "export", out + "/checkpoint-4", exported}, options);
  ASSERT_EQ(exporting.exit_code, 0) << exporting.output;
  const auto generating = hp::testing::run_subprocess(
      {HP_CLI_PATH, "generate", "--model", out, "--prompt", "hello", "--max-new-tokens", "3"}, options);
  ASSERT_EQ(generating.exit_code, 0) << generating.output;
  EXPECT_TRUE(fs::exists(out + "/training_loss.png")) << "the plot is part of what must stay inside output_dir";
  EXPECT_TRUE(fs::exists(out + "/checkpoint-6/trainer_state.json"));

  const auto after = snapshot(root);
  const std::vector<std::string> allowed = {out, exported};
  for (const auto& [path, entry] : before) {
    if (under(path, allowed)) continue;
    auto it = after.find(path);
    if (it == after.end()) {
      ADD_FAILURE() << path << " was removed";
    } else {
      EXPECT_TRUE(it->second == entry) << path << " was modified";
    }
  }
  for (const auto& [path, entry] : after) {
    if (!before.count(path)) {
      EXPECT_TRUE(under(path, allowed)) << path << " was created outside the output folders";
    }
  }
  EXPECT_FALSE(fs::exists(root / "EXECUTED")) << "code from the model folder ran";
  fs::remove_all(root);
}
