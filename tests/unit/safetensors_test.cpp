// safetensors reader/writer and HF checkpoint folders: exact bytes, every dtype, row reads,
// sharded indexes, and hostile files that must fail with a message naming file and tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "hyperparallel/io/hf_checkpoint.h"
#include "hyperparallel/io/safetensors.h"
#include "hyperparallel/platform/user_error.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;
using hp::io::SafetensorsFile;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("hp_safetensors_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// A file with the given header text (length prefix computed unless `declared` is given).
std::string write_raw(const std::string& dir, const std::string& header, const std::string& data,
                      std::optional<uint64_t> declared = std::nullopt) {
  const std::string path = dir + "/raw.safetensors";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = declared.value_or(header.size());
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header << data;
  return path;
}

std::string open_error(const std::string& path) {
  try {
    SafetensorsFile file(path);
  } catch (const hp::UserError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Safetensors, RewritingTheTransformersFilesGivesIdenticalBytes) {
  // model.safetensors was written by transformers' save_pretrained: same bytes exactly.
  // golden.safetensors has several metadata keys, whose order the format leaves open (the
  // Rust writer keeps them in a hash map), so there the data section and every entry must
  // be equal.
  const std::string dir = temp_dir("rewrite");
  for (const std::string name : {"qwen3/model.safetensors", "qwen3_moe/model.safetensors", "qwen3_moe/golden.safetensors"}) {
    const std::string source = HP_SOURCE_DIR "/tests/fixtures/hf/" + name;
    SafetensorsFile file(source);
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& e : file.entries()) tensors.emplace_back(e.name, file.read(e.name));
    const std::string copy = dir + "/copy.safetensors";
    hp::io::write_safetensors(copy, tensors, file.metadata());
    const std::string ours = read_bytes(copy), theirs = read_bytes(source);
    if (file.metadata().size() <= 1) {
      EXPECT_TRUE(ours == theirs) << name << ": " << ours.size() << " vs " << theirs.size() << " bytes";
      continue;
    }
    SafetensorsFile back(copy);
    EXPECT_EQ(back.metadata(), file.metadata());
    ASSERT_EQ(back.entries().size(), file.entries().size());
    for (size_t i = 0; i < file.entries().size(); ++i) {
      EXPECT_EQ(back.entries()[i].name, file.entries()[i].name);
      EXPECT_EQ(back.entries()[i].begin, file.entries()[i].begin);
      EXPECT_EQ(back.entries()[i].end, file.entries()[i].end);
    }
    EXPECT_TRUE(ours.size() == theirs.size() && ours.substr(ours.size() - back.entries().back().end) ==
                                                    theirs.substr(theirs.size() - file.entries().back().end))
        << name;
  }
}

TEST(Safetensors, EveryDtypeRoundTripsIncludingScalarsAndEmptyTensors) {
  const std::string dir = temp_dir("dtypes");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  const auto base = at::arange(-6, 6).reshape({3, 4});
  for (auto dtype : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kShort, at::kChar, at::kByte,
                     at::kBool}) {
    tensors.emplace_back(hp::io::safetensors_dtype_name(dtype), (dtype == at::kByte ? base.abs() : base).to(dtype));
  }
  tensors.emplace_back("scalar", at::tensor(3.5));
  tensors.emplace_back("empty", at::zeros({0, 7}));
  hp::io::write_safetensors(dir + "/all.safetensors", tensors);
  SafetensorsFile file(dir + "/all.safetensors");
  EXPECT_EQ(file.metadata().at("format"), "pt");
  for (const auto& [name, t] : tensors) {
    const at::Tensor back = file.read(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(back.sizes(), t.sizes()) << name;
    EXPECT_TRUE(at::equal(back, t)) << name;
  }
}

TEST(Safetensors, ReadRowsOfAnyDimEqualsNarrow) {
  const std::string dir = temp_dir("rows");
  const at::Tensor t = at::randn({5, 6, 7});
  hp::io::write_safetensors(dir + "/t.safetensors", {{"t", t}});
  SafetensorsFile file(dir + "/t.safetensors");
  for (int64_t dim = 0; dim < 3; ++dim) {
    EXPECT_TRUE(at::equal(file.read_rows("t", dim, 1, 3), t.narrow(dim, 1, 3))) << dim;
  }
  EXPECT_THROW(file.read_rows("t", 0, 4, 2), hp::UserError);
  EXPECT_THROW(file.read_rows("t", 3, 0, 1), hp::UserError);
  EXPECT_THROW(file.read("absent"), hp::UserError);
}

TEST(Safetensors, ReadBoxOfAnyShapeEqualsNarrowOnEveryDim) {
  const std::string dir = temp_dir("box");
  const at::Tensor t = at::randn({5, 6, 7});
  hp::io::write_safetensors(dir + "/t.safetensors", {{"t", t}});
  SafetensorsFile file(dir + "/t.safetensors");
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> boxes = {
      {{1, 2, 3}, {3, 2, 4}}, {{0, 0, 0}, {5, 6, 7}}, {{2, 0, 0}, {2, 6, 7}}, {{0, 3, 0}, {5, 3, 7}}, {{4, 5, 6}, {1, 1, 1}}, {{0, 0, 0}, {0, 6, 7}}};
  for (const auto& [offsets, lengths] : boxes) {
    at::Tensor want = t;
    for (int64_t d = 0; d < 3; ++d) want = want.narrow(d, offsets[d], lengths[d]);
    EXPECT_TRUE(at::equal(file.read_box("t", offsets, lengths), want)) << offsets[0] << offsets[1] << offsets[2];
  }
  EXPECT_THROW(file.read_box("t", {0, 0, 5}, {1, 1, 3}), hp::UserError);
  EXPECT_THROW(file.read_box("t", {0, 0}, {1, 1}), hp::UserError);
}

TEST(Safetensors, HostileFilesFailWithTheFileAndTensorNamed) {
  const std::string dir = temp_dir("hostile");
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  struct Case {
    std::string what, header, data;
    std::optional<uint64_t> declared;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"header length beyond the limit", "{}", "", uint64_t{1} << 40, "exceeds the limit"},
      {"header longer than the file", "{}", "", 4096, "truncated"},
      {"not JSON", "{\"w\": [1, 2", "", std::nullopt, "not valid JSON"},
      {"not an object", "[1,2,3]", "", std::nullopt, "not a JSON object"},
      {"nested too deep", std::string(64, '[') + std::string(64, ']'), "", std::nullopt, "nests deeper"},
      {"offsets past the end", "{" + ok_entry + "}", std::string(4, '\0'), std::nullopt, "tensor 'w'"},
      {"end before begin", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", std::string(8, '\0'), std::nullopt,
       "outside the data section"},
      {"overlapping tensors",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       std::string(12, '\0'), std::nullopt, "overlap"},
      {"shape and bytes disagree", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0'),
       std::nullopt, "needs 12 bytes"},
      {"shape overflows", R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})",
       std::string(8, '\0'), std::nullopt, "too large"},
      {"negative dimension", R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0'),
       std::nullopt, "non-negative integer"},
      {"unknown dtype", R"({"w":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})", std::string(8, '\0'),
       std::nullopt, "F8_E4M3 is not supported"},
      {"entry without offsets", R"({"w":{"dtype":"F32","shape":[2]}})", std::string(8, '\0'), std::nullopt,
       "dtype, shape and data_offsets"},
      {"metadata not strings", R"({"__metadata__":{"format":1}})", "", std::nullopt, "not a string"},
  };
  for (const auto& c : cases) {
    const std::string path = write_raw(dir, c.header, c.data, c.declared);
    const std::string message = open_error(path);
    EXPECT_NE(message.find(c.expect), std::string::npos) << c.what << ": " << message;
    EXPECT_NE(message.find(path), std::string::npos) << c.what << ": " << message;
  }
  // Shorter than the length prefix, and a missing file.
  std::ofstream(dir + "/short.safetensors") << "abc";
  EXPECT_NE(open_error(dir + "/short.safetensors").find("truncated"), std::string::npos);
  EXPECT_NE(open_error(dir + "/missing.safetensors").find("cannot open"), std::string::npos);
}

TEST(Safetensors, ShardedCheckpointsWriteAnIndexAndReadBack) {
  const std::string dir = temp_dir("sharded");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (int i = 0; i < 5; ++i) tensors.emplace_back("layer." + std::to_string(i) + ".weight", at::randn({16, 16}));  // 1 KiB each
  const auto files = hp::io::save_hf_checkpoint(dir, tensors, 2500);
  ASSERT_EQ(files.size(), 4u);  // three shards of <= 2 tensors, then the index
  EXPECT_EQ(files[0], "model-00001-of-00003.safetensors");
  EXPECT_EQ(files.back(), "model.safetensors.index.json");
  EXPECT_NE(read_bytes(dir + "/model.safetensors.index.json").find("\"total_size\": 5120"), std::string::npos);
  hp::io::HfCheckpoint checkpoint(dir);
  EXPECT_EQ(checkpoint.names().size(), 5u);
  for (const auto& [name, t] : tensors) EXPECT_TRUE(at::equal(checkpoint.read(name), t)) << name;
  EXPECT_TRUE(at::equal(checkpoint.read_rows("layer.3.weight", 0, 8, 8), tensors[3].second.narrow(0, 8, 8)));

  // Saving again unsharded replaces the index by one file.
  hp::io::save_hf_checkpoint(dir, tensors, hp::io::parse_byte_size("5GB"));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_TRUE(at::equal(hp::io::HfCheckpoint(dir).read("layer.0.weight"), tensors[0].second));
}

TEST(Safetensors, IndexesThatPointOutsideTheFolderAreRejected) {
  const std::string dir = temp_dir("evil");
  std::ofstream(dir + "/model.safetensors.index.json") << R"({"weight_map": {"w": "../../etc/passwd"}})";
  try {
    hp::io::HfCheckpoint checkpoint(dir);
    FAIL() << "no error";
  } catch (const hp::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("inside the model folder"), std::string::npos) << e.what();
  }
  fs::remove(dir + "/model.safetensors.index.json");
  EXPECT_THROW(hp::io::HfCheckpoint checkpoint(dir), hp::UserError);  // no weights at all
}

TEST(Safetensors, ByteSizesParseLikeTransformers) {
  EXPECT_EQ(hp::io::parse_byte_size("5GB"), 5000000000ull);
  EXPECT_EQ(hp::io::parse_byte_size("2GiB"), 2ull << 30);
  EXPECT_EQ(hp::io::parse_byte_size("500MB"), 500000000ull);
  EXPECT_EQ(hp::io::parse_byte_size("1234"), 1234ull);
  EXPECT_THROW(hp::io::parse_byte_size("five GB"), hp::UserError);
  EXPECT_THROW(hp::io::parse_byte_size("5TB"), hp::UserError);
  EXPECT_THROW(hp::io::parse_byte_size("0"), hp::UserError);
}
