// HfCheckpoint: the weights of a Hugging Face model folder, one safetensors file or many.
//
// A folder holds either `model.safetensors`, or `model.safetensors.index.json` whose
// weight_map names the file of every tensor (each file opened once, on first use). Files
// are memory-mapped and validated when opened (io/safetensors.h); the index is checked for
// names that point outside the folder. Reads return copies in the file's dtype, whole or
// as a range of one dim's slices, so a rank can read just its shard of a tensor.
//
// save_hf_checkpoint writes what transformers' save_pretrained writes: one
// model.safetensors, or model-0000k-of-0000n.safetensors files filled in order up to
// max_shard_size bytes each plus the index (total_size, weight_map, keys sorted, indent 2).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hyperparallel/io/safetensors.h"

namespace hyperparallel::io {

class HfCheckpoint {
 public:
  explicit HfCheckpoint(const std::string& dir);  // UserError when no weights are found
  const std::string& dir() const { return dir_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return file_of_.count(name) > 0; }
  const SafetensorsEntry& entry(const std::string& name);
  at::Tensor read(const std::string& name);
  at::Tensor read_rows(const std::string& name, int64_t dim, int64_t first, int64_t count);
  at::Tensor read_box(const std::string& name, const std::vector<int64_t>& offsets, const std::vector<int64_t>& lengths);

 private:
  SafetensorsFile& file_for(const std::string& name);

  std::string dir_;
  std::map<std::string, std::string> file_of_;  // tensor name -> file name within dir_
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
};

// Parses "5GB", "500MB", "2GiB", "100KB" or a plain byte count (decimal units are powers of
// 10, binary ones powers of 2, as transformers does). UserError otherwise.
uint64_t parse_byte_size(const std::string& text);

// Writes `tensors` (in the given order) into `dir` as above; returns the files written.
std::vector<std::string> save_hf_checkpoint(const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                            uint64_t max_shard_size);

}  // namespace hyperparallel::io
