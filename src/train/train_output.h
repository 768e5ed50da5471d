// What rank 0 writes into output_dir while and after training: trainer_log.jsonl (appended
// line by line and flushed, so a killed run keeps what it logged), train_summary.json and the
// loss plot (a self-contained SVG).
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hyperparallel::train {

class TrainerLog {
 public:
  // Truncates output_dir/trainer_log.jsonl unless `append` (resuming).
  TrainerLog(const std::string& output_dir, bool append);
  void write(const nlohmann::json& line);

 private:
  std::ofstream out_;
};

// Writes `value` to `path` through a temporary file and a rename.
void write_json_file(const std::string& path, const nlohmann::json& value);

// A line plot of (step, loss) as SVG, with axes labelled by their ranges.
void write_loss_svg(const std::string& path, const std::vector<std::pair<int64_t, double>>& points);

}  // namespace hyperparallel::train
