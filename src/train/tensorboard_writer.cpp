// TensorBoard event files. See tensorboard_writer.h.
#include "tensorboard_writer.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::train {
namespace {

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;  // reflected Castagnoli polynomial
    table[i] = c;
  }
  return table;
}

// Protobuf wire format, the three encodings the Event fields need.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
template <typename T>
void fixed(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // little-endian host (x86-64), as the wire format is
  out.append(bytes, sizeof(T));
}
void bytes_field(std::string& out, int field, const std::string& value) {
  varint(out, static_cast<uint64_t>(field) << 3 | 2);
  varint(out, value.size());
  out += value;
}

double unix_time() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::string event(int64_t step, const std::string& payload_field) {
  std::string e;
  varint(e, 1 << 3 | 1);  // wall_time: double
  fixed(e, unix_time());
  varint(e, 2 << 3 | 0);  // step: int64
  varint(e, static_cast<uint64_t>(step));
  return e + payload_field;
}

std::string hostname() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string default_tensorboard_dir(const std::string& output_dir) {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d_%H-%M-%S", std::localtime(&now));
  return output_dir + "/runs/" + stamp + "_" + hostname();
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UserError("cannot create the TensorBoard folder " + dir + " (report_to: tensorboard): " + ec.message());
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(unix_time())) + "." + hostname() + "." +
          std::to_string(getpid()) + ".0";
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw UserError("cannot write " + path_ + " (report_to: tensorboard)");
  std::string version;
  bytes_field(version, 3, "brain.Event:2");
  record(event(0, version));
  flush();
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
  std::string v;
  bytes_field(v, 1, tag);
  varint(v, 2 << 3 | 5);  // simple_value: float
  fixed(v, static_cast<float>(value));
  std::string summary;
  bytes_field(summary, 1, v);
  std::string payload;
  bytes_field(payload, 5, summary);
  record(event(step, payload));
}

void TensorBoardWriter::flush() { out_.flush(); }

void TensorBoardWriter::record(const std::string& data) {
  std::string framed;
  const uint64_t length = data.size();
  fixed(framed, length);
  fixed(framed, masked_crc32c(&length, sizeof(length)));
  framed += data;
  fixed(framed, masked_crc32c(data.data(), data.size()));
  out_.write(framed.data(), static_cast<std::streamsize>(framed.size()));
}

}  // namespace hyperparallel::train
