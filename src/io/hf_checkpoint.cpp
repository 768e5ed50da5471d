// Weights of a Hugging Face folder: single file or sharded with an index. See io/hf_checkpoint.h.
#include "hyperparallel/io/hf_checkpoint.h"

#include <ATen/ATen.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hyperparallel/io/user_files.h"
#include "hyperparallel/platform/user_error.h"
#include "io/atomic_write.h"

namespace hyperparallel::io {
namespace fs = std::filesystem;

namespace {
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr uint64_t kMaxIndexBytes = 64ull << 20;

bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos;
}
}  // namespace

HfCheckpoint::HfCheckpoint(const std::string& dir) : dir_(dir) {
  const fs::path index_path = fs::path(dir) / kIndexFile;
  if (fs::exists(fs::path(dir) / kSingleFile)) {
    auto file = std::make_unique<SafetensorsFile>((fs::path(dir) / kSingleFile).string());
    for (const auto& e : file->entries()) file_of_[e.name] = kSingleFile;
    files_[kSingleFile] = std::move(file);
    return;
  }
  if (!fs::exists(index_path)) {
    throw UserError("model folder " + dir + " has neither " + kSingleFile + " nor " + kIndexFile +
                    "; point model_name_or_path at a folder saved by save_pretrained");
  }
  nlohmann::json index = read_user_json(index_path.string(), kMaxIndexBytes, "the checkpoint index");
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw UserError(index_path.string() + " has no weight_map object");
  }
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string() || !plain_file_name(it.value().get<std::string>())) {
      throw UserError(index_path.string() + ": weight_map entry '" + it.key() +
                      "' must name a file inside the model folder");
    }
    file_of_[it.key()] = it.value().get<std::string>();
  }
}

std::vector<std::string> HfCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& item : file_of_) out.push_back(item.first);
  return out;
}

SafetensorsFile& HfCheckpoint::file_for(const std::string& name) {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) throw UserError("model folder " + dir_ + " has no weight '" + name + "'");
  auto& file = files_[it->second];
  if (!file) file = std::make_unique<SafetensorsFile>((fs::path(dir_) / it->second).string());
  if (!file->contains(name)) {
    throw UserError(file->path() + " lacks tensor '" + name + "' that " + kIndexFile + " places there");
  }
  return *file;
}

const SafetensorsEntry& HfCheckpoint::entry(const std::string& name) { return file_for(name).entry(name); }
at::Tensor HfCheckpoint::read(const std::string& name) { return file_for(name).read(name); }
at::Tensor HfCheckpoint::read_rows(const std::string& name, int64_t dim, int64_t first, int64_t count) {
  return file_for(name).read_rows(name, dim, first, count);
}

at::Tensor HfCheckpoint::read_box(const std::string& name, const std::vector<int64_t>& offsets, const std::vector<int64_t>& lengths) {
  return file_for(name).read_box(name, offsets, lengths);
}

uint64_t parse_byte_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string unit = text.substr(digits);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::map<std::string, uint64_t> units = {{"", 1},           {"B", 1},
                                                 {"KB", 1000},      {"MB", 1000 * 1000},
                                                 {"GB", 1000000000}, {"KIB", 1ull << 10},
                                                 {"MIB", 1ull << 20}, {"GIB", 1ull << 30}};
  auto it = units.find(unit);
  if (digits == 0 || digits > 12 || it == units.end()) {
    throw UserError("size '" + text + "' is not a byte count; write e.g. 5GB, 500MB, 2GiB or 1000000");
  }
  const uint64_t value = std::stoull(text.substr(0, digits)) * it->second;
  if (value == 0) throw UserError("size '" + text + "' must be positive");
  return value;
}

std::vector<std::string> save_hf_checkpoint(const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                            uint64_t max_shard_size) {
  fs::create_directories(dir);
  // Fill shards in order; a tensor that does not fit starts the next one (as transformers'
  // split_torch_state_dict_into_shards does), one larger than the limit sits alone.
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
  uint64_t current = 0, total = 0;
  for (const auto& item : tensors) {
    const uint64_t bytes = item.second.numel() * item.second.element_size();
    if (!shards.back().empty() && current + bytes > max_shard_size) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(item);
    current += bytes;
    total += bytes;
  }
  std::vector<std::string> written;
  if (shards.size() == 1) {
    write_safetensors((fs::path(dir) / kSingleFile).string(), shards[0]);
    std::remove((fs::path(dir) / kIndexFile).c_str());
    return {kSingleFile};
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_safetensors((fs::path(dir) / name).string(), shards[i]);
    for (const auto& item : shards[i]) weight_map[item.first] = name;
    written.push_back(name);
  }
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomically((fs::path(dir) / kIndexFile).string(), index.dump(2) + "\n");
  std::remove((fs::path(dir) / kSingleFile).c_str());
  written.push_back(kIndexFile);
  return written;
}

}  // namespace hyperparallel::io
