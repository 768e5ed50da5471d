// Trainer output files. See train_output.h.
#include "train_output.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "hyperparallel/io/user_files.h"
#include "hyperparallel/platform/user_error.h"
#include "io/atomic_write.h"

namespace hyperparallel::train {

TrainerLog::TrainerLog(const std::string& output_dir, int64_t resume_step) {
  const std::string path = output_dir + "/trainer_log.jsonl";
  std::string kept_text;
  if (resume_step > 0) {
    std::ifstream in(path);
    int64_t number = 0;
    for (std::string line; std::getline(in, line);) {
      ++number;
      if (!io::json_nesting_within(line.data(), line.size(), io::kMaxUserJsonDepth)) {
        throw UserError(path + ":" + std::to_string(number) + " nests JSON deeper than " + std::to_string(io::kMaxUserJsonDepth) +
                        " levels; it is not a line this trainer wrote (remove it, or resume into a fresh output_dir)");
      }
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("step")) continue;  // a line cut by a kill
      const char* value = j.contains("loss") ? "loss" : "eval_loss";  // a training line or an evaluation's
      if (!j.contains(value)) continue;
      if (!j["step"].is_number_integer() || !j[value].is_number()) {
        throw UserError(path + ":" + std::to_string(number) +
                        ": 'step' must be an integer and 'loss' (or 'eval_loss') a number; it is not a line this trainer wrote (remove it, or resume "
                        "into a fresh output_dir)");
      }
      if (j["step"].get<int64_t>() > resume_step) break;
      if (j.contains("loss")) kept_.emplace_back(j["step"].get<int64_t>(), j["loss"].get<double>());
      lines_.push_back(j);
      kept_text += line + "\n";
    }
  }
  io::write_file_atomically(path, kept_text);
  out_.open(path, std::ios::app);
  if (!out_) throw UserError("cannot write " + path + "; is output_dir writable?");
}

void TrainerLog::write(const nlohmann::json& line) {
  lines_.push_back(line);
  out_ << line.dump() << '\n';
  out_.flush();
}

namespace {
constexpr const char* kUpAndClear = "\x1b[1A\x1b[2K";
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

void ProgressDisplay::update(int64_t step, double loss, double lr, double tokens_per_s, double eta_s) {
  if (!terminal_) return;
  constexpr int kWidth = 30;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * step / total_) : kWidth;
  char text[200];
  std::snprintf(text, sizeof(text), "[%s%s] %lld/%lld loss %.4f lr %.3g tok/s %.0f eta %.0fs", std::string(filled, '#').c_str(),
                std::string(kWidth - filled, '.').c_str(), static_cast<long long>(step), static_cast<long long>(total_), loss, lr,
                tokens_per_s, eta_s);
  bar_ = text;  // kept even when not drawn now: a log line redraws the latest state
  const double t = now_s();
  if (step != total_ && last_draw_s_ >= 0 && t - last_draw_s_ < 0.2) return;
  last_draw_s_ = t;
  draw();
}

void ProgressDisplay::draw() {
  out_ << (shown_ ? kUpAndClear : "") << bar_ << "\n" << std::flush;
  shown_ = true;
}

void ProgressDisplay::line(const std::string& text) {
  if (terminal_ && shown_) {
    out_ << kUpAndClear << text << "\n";
    shown_ = false;
    draw();
  } else {
    out_ << text << "\n" << std::flush;
  }
}

void ProgressDisplay::finish() { shown_ = false; }

bool convert_svg_to_png(const std::string& svg_path, const std::string& png_path) {
  const char* path_env = std::getenv("PATH");
  std::string converter;
  std::stringstream dirs(path_env ? path_env : "");
  for (std::string dir; std::getline(dirs, dir, ':') && converter.empty();) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/rsvg-convert";
    if (access(candidate.c_str(), X_OK) == 0) converter = candidate;
  }
  if (converter.empty()) return false;
  // Run directly (no shell), output to a temporary name renamed on success.
  const std::string tmp = png_path + ".tmp";
  std::vector<std::string> args = {converter, "-o", tmp, svg_path};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, converter.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return false;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::remove(tmp.c_str());
    return false;
  }
  return std::rename(tmp.c_str(), png_path.c_str()) == 0;
}

void write_json_file(const std::string& path, const nlohmann::json& value) { io::write_file_atomically(path, value.dump(2) + "\n"); }

void write_loss_svg(const std::string& path, const std::vector<std::pair<int64_t, double>>& points) {
  constexpr double kW = 640, kH = 400, kLeft = 70, kRight = 20, kTop = 30, kBottom = 50;
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << kH << "\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << kW / 2 << "\" y=\"20\" text-anchor=\"middle\" font-family=\"sans-serif\" font-size=\"14\">training loss</text>\n";
  if (!points.empty()) {
    int64_t x0 = points.front().first, x1 = points.back().first;
    double y0 = points.front().second, y1 = y0;
    for (const auto& [x, y] : points) {
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
    if (x1 == x0) x1 = x0 + 1;
    if (y1 == y0) y1 = y0 + 1;
    const auto px = [&](int64_t x) { return kLeft + (kW - kLeft - kRight) * static_cast<double>(x - x0) / static_cast<double>(x1 - x0); };
    const auto py = [&](double y) { return kH - kBottom - (kH - kTop - kBottom) * (y - y0) / (y1 - y0); };
    svg << "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"";
    for (const auto& [x, y] : points) svg << px(x) << "," << py(y) << " ";
    svg << "\"/>\n";
    char label[64];
    const auto text = [&](double x, double y, const char* anchor, const std::string& s) {
      svg << "<text x=\"" << x << "\" y=\"" << y << "\" text-anchor=\"" << anchor
          << "\" font-family=\"sans-serif\" font-size=\"11\">" << s << "</text>\n";
    };
    std::snprintf(label, sizeof(label), "%.4g", y1);
    text(kLeft - 5, kTop + 4, "end", label);
    std::snprintf(label, sizeof(label), "%.4g", y0);
    text(kLeft - 5, kH - kBottom, "end", label);
    text(kLeft, kH - kBottom + 15, "middle", std::to_string(x0));
    text(kW - kRight, kH - kBottom + 15, "middle", std::to_string(x1));
    text(kW / 2, kH - 10, "middle", "step");
    svg << "<line x1=\"" << kLeft << "\" y1=\"" << kH - kBottom << "\" x2=\"" << kW - kRight << "\" y2=\"" << kH - kBottom
        << "\" stroke=\"black\"/>\n<line x1=\"" << kLeft << "\" y1=\"" << kTop << "\" x2=\"" << kLeft << "\" y2=\"" << kH - kBottom
        << "\" stroke=\"black\"/>\n";
  }
  svg << "</svg>\n";
  io::write_file_atomically(path, svg.str());
}

}  // namespace hyperparallel::train
