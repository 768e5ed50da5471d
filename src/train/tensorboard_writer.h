// TensorBoard scalars (`report_to: tensorboard`), written as TensorBoard's own event files so
// `tensorboard --logdir` and any TFRecord reader shows them, without TensorFlow or protobuf.
//
// A file is a sequence of TFRecords — uint64 length, masked CRC-32C of the length, the bytes,
// masked CRC-32C of the bytes (little-endian) — each holding one serialized `tensorflow.Event`
// protobuf: wall_time (field 1, double), step (2, int64), and either file_version (3,
// "brain.Event:2", the first record) or a Summary (5) of Values {tag (1), simple_value (2,
// float)}. The few fields are encoded by hand. Each scalar goes out as its own record and the
// file is flushed per step, so a killed run keeps what it logged. The folder follows HF's
// TensorBoardCallback: `logging_dir` when set, else output_dir/runs/<date>_<host>, file
// events.out.tfevents.<unix time>.<host>.<pid>.0; the tags are HF's (train/loss,
// train/learning_rate, train/grad_norm, train/epoch, ...).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace hyperparallel::train {

// CRC-32C (Castagnoli), as TFRecord framing uses it, and its masked form.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

class TensorBoardWriter {
 public:
  // Creates `dir` (and parents) and the event file in it; UserError when it cannot.
  explicit TensorBoardWriter(const std::string& dir);
  void scalar(const std::string& tag, double value, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event);
  std::string path_;
  std::ofstream out_;
};

// HF's default logging_dir: output_dir/runs/<YYYY-MM-DD_HH-MM-SS>_<host>.
std::string default_tensorboard_dir(const std::string& output_dir);

}  // namespace hyperparallel::train
