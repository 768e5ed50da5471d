// Tokenized rows made once per job and shared through a file. See tokenized_cache.h.
#include "tokenized_cache.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "hyperparallel/platform/user_error.h"
#include "io/content_hash.h"

namespace hyperparallel::train {
namespace fs = std::filesystem;

std::string tokenized_cache_dir(const std::string& configured) {
  if (configured == "none") return "";
  if (!configured.empty()) return configured;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return (fs::path(xdg) / "hyperparallel" / "tokenized").string();
  const char* home = std::getenv("HOME");
  if (home && *home) return (fs::path(home) / ".cache" / "hyperparallel" / "tokenized").string();
  return "";  // nowhere to keep it: tokenize in memory
}

int tokenizing_threads(const std::optional<int64_t>& configured) {
  if (configured) return static_cast<int>(std::min<int64_t>(*configured, 1024));
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

nlohmann::json rows_settings(const TrainConfig& c, const std::string& datasets, const data::DatasetFile* file) {
  nlohmann::json s;
  s["stage"] = c.stage;
  s["dataset"] = datasets;
  if (file) {
    s["dataset_file"] = {{"path", file->path}, {"formatting", file->formatting}, {"column", file->column},
                         {"role_tag", file->role_tag}, {"content_tag", file->content_tag}, {"text_template", file->text_template}};
  }
  s["template"] = c.chat_template;
  s["cutoff_len"] = c.cutoff_len;
  s["packing"] = c.packing;
  s["train_on_prompt"] = c.train_on_prompt;
  s["mask_history"] = c.mask_history;
  s["enable_thinking"] = c.enable_thinking;
  s["default_system"] = c.default_system ? nlohmann::json(*c.default_system) : nlohmann::json();
  s["tool_format"] = c.tool_format ? nlohmann::json(*c.tool_format) : nlohmann::json();
  s["max_samples"] = c.max_samples ? nlohmann::json(*c.max_samples) : nlohmann::json();
  s["bad_records"] = c.bad_records;
  return s;
}

std::string rows_key(const nlohmann::json& settings, const std::vector<std::string>& files) {
  io::ContentHash hash;
  hash.add(kRowsRevision).add(settings.dump());
  for (const std::string& f : files) hash.add(fs::path(f).filename().string()).add_file(f);
  return hash.hex();
}

FileLock::FileLock(const std::string& path, bool only_if_writable) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0 && only_if_writable && (errno == EACCES || errno == EROFS || errno == EPERM)) return;
  if (fd_ < 0) throw UserError(path + ": cannot be created (" + std::strerror(errno) + ")");
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const std::string why = std::strerror(errno);
    ::close(fd_);
    throw UserError(path + ": cannot be locked (" + why + ")");
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

namespace {

// Whether `path` was last written before `time`.
bool written_before(const std::string& path, std::chrono::system_clock::time_point time) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return true;
  const auto written = std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
  return written < time;
}

}  // namespace

SavedRows load_or_build_rows(const std::string& path, std::optional<std::chrono::system_clock::time_point> rebuild_before,
                             const std::function<data::TokenRows()>& build, std::vector<std::string>& notes) {
  const FileLock lock(path + ".lock");
  SavedRows out;
  out.path = path;
  const bool stale = rebuild_before && written_before(path, *rebuild_before);
  if (fs::exists(path) && !stale) {
    try {
      out.rows = data::TokenRows::open(path);
      out.origin = RowsOrigin::kReadFromFile;
      return out;
    } catch (const UserError& e) {
      notes.push_back(std::string(e.what()) + "; tokenizing again");
    }
  }
  build().save(path);
  out.rows = data::TokenRows::open(path);  // mapped, like every other rank's
  out.origin = RowsOrigin::kBuiltAndSaved;
  return out;
}

}  // namespace hyperparallel::train
