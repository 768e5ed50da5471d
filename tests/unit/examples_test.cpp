// The shipped example configs run as written (pointed at a small Hugging Face folder made
// here, with the project's tokenizer), and do_train: false loads, evaluates and exports.
#include <gtest/gtest.h>

#include <filesystem>

#include "hyperparallel/io/safetensors.h"
#include "support/hf_folder.h"
#include "support/subprocess.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;

namespace {

std::string tiny_hf_folder() { return hp::testing::write_tiny_hf_folder(::testing::TempDir() + "hp_examples_qwen3_tiny"); }

hp::testing::SubprocessResult train(const std::string& yaml, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {HP_CLI_PATH, "train", HP_SOURCE_DIR "/examples/" + yaml, "--dataset_dir=" HP_SOURCE_DIR "/examples/data"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return hp::testing::run_subprocess(argv, {std::chrono::seconds(180)});
}

}  // namespace

TEST(Examples, EveryExampleConfigTrainsAHuggingFaceFolder) {
  const std::string model = tiny_hf_folder();
  for (const std::string yaml : {"qwen3_fsdp.yaml", "qwen3_hsdp.yaml", "qwen3_fsdp_tp.yaml", "qwen3_cp.yaml", "qwen3_pp.yaml", "llamafactory_sft.yaml"}) {
    SCOPED_TRACE(yaml);
    const std::string out = ::testing::TempDir() + "hp_examples_" + yaml;
    fs::remove_all(out);
    const auto run = train(yaml, {"--model_name_or_path=" + model, "--max_steps=2", "--output_dir=" + out});
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("step 2/2 loss"), std::string::npos) << run.output;
    EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
    fs::remove_all(out);
  }
  fs::remove_all(model);
}

TEST(Examples, DoTrainFalseLoadsAndExportsUnchanged) {
  const std::string model = tiny_hf_folder();
  const std::string out = ::testing::TempDir() + "hp_examples_no_train";
  fs::remove_all(out);
  const auto run = train("qwen3_fsdp.yaml", {"--model_name_or_path=" + model, "--do_train=false", "--output_dir=" + out});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("without training"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("step "), std::string::npos) << run.output;
  const hp::io::SafetensorsFile a(model + "/model.safetensors"), b(out + "/model.safetensors");
  ASSERT_EQ(a.entries().size(), b.entries().size());
  for (const auto& e : a.entries()) EXPECT_TRUE(at::equal(a.read(e.name), b.read(e.name))) << e.name;
  fs::remove_all(out);
  fs::remove_all(model);
}
