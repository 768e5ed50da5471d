// safetensors: read and write Hugging Face's tensor file format.
//
// A file is an 8-byte little-endian header length n, n bytes of JSON, then the data. The
// JSON maps each tensor name to {dtype, shape, data_offsets: [begin, end)} relative to the
// data section, plus an optional "__metadata__" object of strings.
//
// SafetensorsFile maps the file read-only (mmap) and trusts nothing in it: the header is
// size-bounded (kMaxHeaderBytes) and nesting-bounded before it is parsed, and every entry's
// dtype, shape and offsets are checked against the file size (overflow-safe) and against
// every other entry (no overlaps) when the file is opened. Every error is a UserError that
// names the file and, where there is one, the tensor. Reads copy out of the mapping (or
// return a view that keeps the mapping alive), so a file is never over-read.
//
// write_safetensors writes what the Rust `safetensors` writer writes: compact JSON with
// "__metadata__" first, tensors ordered by dtype alignment (largest first) then name and
// stored contiguously in that order, the header padded with spaces to a multiple of 8.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hyperparallel::io {

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;  // as in the file: "F32", "BF16", ...
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range in the data section
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  static constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the Rust reader's limit
  static constexpr int kMaxJsonDepth = 16;

  explicit SafetensorsFile(const std::string& path);  // throws UserError
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in header order
  bool contains(const std::string& name) const { return index_.count(name) > 0; }
  const SafetensorsEntry& entry(const std::string& name) const;  // UserError when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // A copy of the tensor in its file dtype.
  at::Tensor read(const std::string& name) const;
  // A copy of `count` slices of dim `dim` starting at `first` (e.g. one rank's rows). For
  // dim 0 only those bytes of the file are touched.
  at::Tensor read_rows(const std::string& name, int64_t dim, int64_t first, int64_t count) const;
  // A copy of the box [offsets[d], offsets[d] + lengths[d]) on every dim (one rank's N-D
  // piece): only the box's bytes are copied, in runs as long as the box allows.
  at::Tensor read_box(const std::string& name, const std::vector<int64_t>& offsets, const std::vector<int64_t>& lengths) const;

 private:
  struct Mapping;
  void parse_header(const char* json, uint64_t length, uint64_t data_size);
  const char* data_of(const SafetensorsEntry& e) const;

  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (any order; names unique) to `path` atomically (a temporary file renamed
// into place). Throws UserError for duplicate names or a dtype safetensors cannot hold.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// "F32" <-> at::kFloat and friends; UserError for names/types outside the supported set.
at::ScalarType safetensors_dtype(const std::string& name);
std::string safetensors_dtype_name(at::ScalarType dtype);

}  // namespace hyperparallel::io
