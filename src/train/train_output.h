// What rank 0 writes into output_dir while and after training: trainer_log.jsonl (appended
// line by line and flushed, so a killed run keeps what it logged), train_summary.json and the
// loss plot (a self-contained SVG); and what it shows: a progress bar on a terminal, plain
// lines elsewhere.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hyperparallel::train {

class TrainerLog {
 public:
  // A fresh run (resume_step 0) starts an empty output_dir/trainer_log.jsonl; a resumed one
  // keeps the lines up to resume_step (a run killed after its last checkpoint logged steps
  // that will now run again) and appends.
  TrainerLog(const std::string& output_dir, int64_t resume_step);
  void write(const nlohmann::json& line);
  // (step, loss) of the kept lines, for the loss plot.
  const std::vector<std::pair<int64_t, double>>& kept() const { return kept_; }
  // Every line of the file: the kept ones and those written since.
  const std::vector<nlohmann::json>& lines() const { return lines_; }

 private:
  std::ofstream out_;
  std::vector<std::pair<int64_t, double>> kept_;
  std::vector<nlohmann::json> lines_;
};

// Rank 0's screen. On a terminal, a bar (step/total, loss, lr, tok/s, ETA) redrawn at most 5
// times a second, with log lines printed above it. Each redraw is a whole line that first
// moves the cursor up and clears the old bar (ANSI), so it survives the launcher's line-wise
// relaying of rank output. Elsewhere only the log lines, unchanged.
class ProgressDisplay {
 public:
  ProgressDisplay(std::ostream& out, bool terminal, int64_t total_steps) : out_(out), terminal_(terminal), total_(total_steps) {}
  void update(int64_t step, double loss, double lr, double tokens_per_s, double eta_s);
  void line(const std::string& text);  // one log line (no trailing newline)
  void finish();                       // the bar stays as the last state; later output goes below

 private:
  void draw();
  std::ostream& out_;
  bool terminal_;
  int64_t total_;
  bool shown_ = false;
  std::string bar_;
  double last_draw_s_ = -1;
};

// Writes `value` to `path` through a temporary file and a rename.
void write_json_file(const std::string& path, const nlohmann::json& value);

// A line plot of (step, loss) as SVG, with axes labelled by their ranges.
void write_loss_svg(const std::string& path, const std::vector<std::pair<int64_t, double>>& points);

// The SVG as PNG through rsvg-convert when it is on PATH (scripts/setup.sh installs it);
// returns false, writing nothing, when it is not or fails.
bool convert_svg_to_png(const std::string& svg_path, const std::string& png_path);

}  // namespace hyperparallel::train
