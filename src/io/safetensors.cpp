// safetensors reader (mmap, validated up front) and writer. See io/safetensors.h.
#include "hyperparallel/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "hyperparallel/io/user_files.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::io {
namespace {

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
  int64_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {"F64", at::kDouble, 8}, {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2},   {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},   {"I32", at::kInt, 4},   {"I16", at::kShort, 2},  {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},    {"BOOL", at::kBool, 1},
};

std::string supported_names() {
  std::string out;
  for (const auto& d : kDtypes) out += std::string(out.empty() ? "" : ", ") + d.name;
  return out;
}

bool multiply_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return true;
  *out = a * b;
  return false;
}

}  // namespace

at::ScalarType safetensors_dtype(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  throw UserError("safetensors dtype " + name + " is not supported; supported: " + supported_names());
}

std::string safetensors_dtype_name(at::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.type == dtype) return d.name;
  }
  throw UserError(std::string("tensors of dtype ") + c10::toString(dtype) + " cannot be written to safetensors");
}

// ---- reader --------------------------------------------------------------------------------

struct SafetensorsFile::Mapping {
  void* base = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (base) munmap(base, size);
  }
};

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  // Non-blocking: opening a FIFO put in the file's place must not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw UserError("cannot open safetensors file " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UserError("safetensors file " + path + " is not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  mapping_ = std::make_shared<Mapping>();
  if (file_size > 0) {
    void* base = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (base == MAP_FAILED) {
      ::close(fd);
      throw UserError("cannot map safetensors file " + path + ": " + std::strerror(errno));
    }
    mapping_->base = base;
    mapping_->size = file_size;
  }
  ::close(fd);
  if (file_size < 8) {
    throw UserError("safetensors file " + path + " is truncated: " + std::to_string(file_size) +
                    " bytes, shorter than the 8-byte header length");
  }
  const auto* bytes = static_cast<const unsigned char*>(mapping_->base);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes) {
    throw UserError("safetensors file " + path + ": header length " + std::to_string(header_len) +
                    " exceeds the limit of " + std::to_string(kMaxHeaderBytes) + " bytes (corrupt or not safetensors)");
  }
  if (header_len > file_size - 8) {
    throw UserError("safetensors file " + path + " is truncated: header says " + std::to_string(header_len) +
                    " bytes of JSON, the file has " + std::to_string(file_size - 8) + " after the length");
  }
  data_start_ = 8 + header_len;
  parse_header(reinterpret_cast<const char*>(bytes + 8), header_len, file_size - data_start_);
}

SafetensorsFile::~SafetensorsFile() = default;

void SafetensorsFile::parse_header(const char* json_text, uint64_t length, uint64_t data_size) {
  const std::string where = "safetensors file " + path_;
  if (!json_nesting_within(json_text, length, kMaxJsonDepth)) {
    throw UserError(where + ": header JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(json_text, json_text + length);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(where + ": header is not valid JSON (" + e.what() + ")");
  }
  if (!header.is_object()) throw UserError(where + ": header is not a JSON object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& value = it.value();
    if (name == "__metadata__") {
      if (!value.is_object()) throw UserError(where + ": __metadata__ is not an object of strings");
      for (auto m = value.begin(); m != value.end(); ++m) {
        if (!m.value().is_string()) throw UserError(where + ": __metadata__ value of '" + m.key() + "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string at_tensor = where + ", tensor '" + name + "'";
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets")) {
      throw UserError(at_tensor + ": entry must be an object with dtype, shape and data_offsets");
    }
    SafetensorsEntry e;
    e.name = name;
    if (!value["dtype"].is_string()) throw UserError(at_tensor + ": dtype is not a string");
    e.dtype_name = value["dtype"].get<std::string>();
    try {
      e.dtype = safetensors_dtype(e.dtype_name);
    } catch (const UserError& err) {
      throw UserError(at_tensor + ": " + err.what());
    }
    uint64_t numel = 1;
    if (!value["shape"].is_array()) throw UserError(at_tensor + ": shape is not an array");
    for (const auto& d : value["shape"]) {
      if (!d.is_number_unsigned()) throw UserError(at_tensor + ": shape has an entry that is not a non-negative integer");
      const uint64_t size = d.get<uint64_t>();
      if (size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) || multiply_overflows(numel, size, &numel)) {
        throw UserError(at_tensor + ": shape is too large");
      }
      e.shape.push_back(static_cast<int64_t>(size));
    }
    const auto& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      throw UserError(at_tensor + ": data_offsets must be [begin, end] with non-negative integers");
    }
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_size) {
      throw UserError(at_tensor + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                      ") lie outside the data section of " + std::to_string(data_size) + " bytes (truncated or corrupt file)");
    }
    uint64_t bytes = 0;
    if (multiply_overflows(numel, static_cast<uint64_t>(c10::elementSize(e.dtype)), &bytes) || bytes != e.end - e.begin) {
      throw UserError(at_tensor + ": " + e.dtype_name + " of shape with " + std::to_string(numel) + " elements needs " +
                      std::to_string(numel * c10::elementSize(e.dtype)) + " bytes, data_offsets give " +
                      std::to_string(e.end - e.begin));
    }
    index_[name] = entries_.size();
    entries_.push_back(std::move(e));
  }
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      throw UserError(where + ": tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name +
                      "' overlap in the data section (corrupt file)");
    }
  }
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw UserError("safetensors file " + path_ + " has no tensor '" + name + "'");
  return entries_[it->second];
}

const char* SafetensorsFile::data_of(const SafetensorsEntry& e) const {
  return static_cast<const char*>(mapping_->base) + data_start_ + e.begin;
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  at::Tensor out = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  if (e.end > e.begin) std::memcpy(out.data_ptr(), data_of(e), e.end - e.begin);
  return out;
}

at::Tensor SafetensorsFile::read_rows(const std::string& name, int64_t dim, int64_t first, int64_t count) const {
  const SafetensorsEntry& e = entry(name);
  const int64_t ndim = static_cast<int64_t>(e.shape.size());
  if (ndim == 0 ? (dim != 0 || first != 0 || count != 1) : (dim < 0 || dim >= ndim)) {
    throw UserError("safetensors file " + path_ + ", tensor '" + name + "': cannot take slices of dim " + std::to_string(dim));
  }
  if (ndim == 0) return read(name);
  std::vector<int64_t> offsets(e.shape.size(), 0), lengths = e.shape;
  offsets[dim] = first;
  lengths[dim] = count;
  return read_box(name, offsets, lengths);
}

at::Tensor SafetensorsFile::read_box(const std::string& name, const std::vector<int64_t>& offsets,
                                     const std::vector<int64_t>& lengths) const {
  const SafetensorsEntry& e = entry(name);
  const size_t ndim = e.shape.size();
  if (offsets.size() != ndim || lengths.size() != ndim) {
    throw UserError("safetensors file " + path_ + ", tensor '" + name + "': a box of " + std::to_string(offsets.size()) +
                    " dims for a tensor of " + std::to_string(ndim));
  }
  for (size_t d = 0; d < ndim; ++d) {
    if (offsets[d] < 0 || lengths[d] < 0 || offsets[d] + lengths[d] > e.shape[d]) {
      throw UserError("safetensors file " + path_ + ", tensor '" + name + "': rows [" + std::to_string(offsets[d]) + ", " +
                      std::to_string(offsets[d] + lengths[d]) + ") of dim " + std::to_string(d) + " exceed its size " +
                      std::to_string(e.shape[d]));
    }
  }
  if (ndim == 0) return read(name);
  at::Tensor out = at::empty(lengths, at::TensorOptions().dtype(e.dtype));
  if (out.numel() == 0) return out;
  // The box is a grid of contiguous runs: dims after `run_dim` are whole, so one run holds
  // lengths[run_dim] x (the whole inner dims) elements.
  const int64_t esize = static_cast<int64_t>(c10::elementSize(e.dtype));
  int64_t run_dim = static_cast<int64_t>(ndim) - 1, inner = esize;
  while (run_dim > 0 && offsets[run_dim] == 0 && lengths[run_dim] == e.shape[run_dim]) inner *= e.shape[run_dim--];
  std::vector<int64_t> strides(ndim, esize);  // bytes, in the file
  for (int64_t d = static_cast<int64_t>(ndim) - 2; d >= 0; --d) strides[d] = strides[d + 1] * e.shape[d + 1];
  const int64_t run_bytes = lengths[run_dim] * inner;
  const char* src = data_of(e);
  char* dst = static_cast<char*>(out.data_ptr());
  std::vector<int64_t> index(run_dim, 0);  // odometer over the dims before run_dim
  while (true) {
    int64_t at = offsets[run_dim] * strides[run_dim];
    for (int64_t d = 0; d < run_dim; ++d) at += (offsets[d] + index[d]) * strides[d];
    std::memcpy(dst, src + at, run_bytes);
    dst += run_bytes;
    int64_t d = run_dim - 1;
    while (d >= 0 && ++index[d] == lengths[d]) index[d--] = 0;
    if (d < 0) break;
  }
  return out;
}

// ---- writer --------------------------------------------------------------------------------

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, at::Tensor>> order;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") throw UserError("a tensor cannot be named __metadata__");
    safetensors_dtype_name(t.scalar_type());
    order.emplace_back(name, t.detach().to(at::kCPU).contiguous());
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    const size_t sa = c10::elementSize(a.second.scalar_type()), sb = c10::elementSize(b.second.scalar_type());
    return sa != sb ? sa > sb : a.first < b.first;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    if (order[i].first == order[i - 1].first) throw UserError("duplicate tensor name " + order[i].first + " for " + path);
  }
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : order) {
    const uint64_t bytes = t.numel() * t.element_size();
    header[name] = {{"dtype", safetensors_dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw UserError("cannot write " + tmp + ": " + std::strerror(errno));
    unsigned char len[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& [name, t] : order) {
      out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * t.element_size()));
    }
    out.flush();
    if (!out) throw UserError("writing " + tmp + " failed (disk full?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw UserError("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  }
}

}  // namespace hyperparallel::io
