#include "output_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/train/checkpoint.h"

namespace hyperparallel::train {
namespace fs = std::filesystem;

namespace {

constexpr const char* kLockFile = ".hyperparallel.lock";

bool within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin(), o = outer.begin();
  for (; o != outer.end(); ++i, ++o) {
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

fs::path canonical_or_self(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(path), ec);
  return ec ? fs::path(path).lexically_normal() : p;
}

// The run's inputs that exist (folders; a dataset file), with the key that names each.
std::vector<std::pair<std::string, fs::path>> input_folders(const TrainConfig& c) {
  std::vector<std::pair<std::string, fs::path>> out;
  std::error_code ec;
  if (!models::is_debug_flavour(c.model_name_or_path) && fs::is_directory(c.model_name_or_path, ec)) {
    out.emplace_back("model_name_or_path", canonical_or_self(c.model_name_or_path));
  }
  if (!c.tokenizer.empty() && fs::exists(c.tokenizer, ec)) {  // a tokenizer folder, or the folder of a tokenizer.json
    const fs::path t = fs::is_directory(c.tokenizer, ec) ? fs::path(c.tokenizer) : canonical_or_self(c.tokenizer).parent_path();
    out.emplace_back("tokenizer", canonical_or_self(t.string()));
  }
  if (!c.dataset_dir.empty() && fs::is_directory(c.dataset_dir, ec)) out.emplace_back("dataset_dir", canonical_or_self(c.dataset_dir));
  // A dataset file (not its folder: an output_dir beside it is fine) or a dataset folder.
  if (!c.dataset_file.path.empty() && fs::exists(c.dataset_file.path, ec)) {
    out.emplace_back("dataset_file.path", canonical_or_self(c.dataset_file.path));
  }
  return out;
}

bool holds_a_run(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "trainer_log.jsonl", ec) || fs::exists(dir / "train_summary.json", ec)) return true;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().filename().string().rfind("checkpoint-", 0) == 0) return true;
  }
  return false;
}

// Empty but for the lock file a run that stopped early (a bad dataset, say) leaves behind.
bool empty_but_the_lock(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().filename() != kLockFile) return false;
  }
  return true;
}

// "" when rank 0 may use the folder; else the problem.
std::string check_and_create(const TrainConfig& c, int& lock_fd) {
  const fs::path out = canonical_or_self(c.output_dir);
  for (const auto& [key, in] : input_folders(c)) {
    if (within(out, in) || within(in, out)) {
      return "output_dir " + c.output_dir + (out == in ? " is " : within(out, in) ? " is inside " : " contains ") + key + " " +
             in.string() + "; the run writes its export and checkpoints there, so pick a folder apart from its inputs";
    }
  }
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec)) return "output_dir " + c.output_dir + " is a file; give a folder";
  if (fs::is_directory(out, ec) && !empty_but_the_lock(out)) {
    const bool run = holds_a_run(out);
    if (run && !c.overwrite_output_dir && c.resume_from_checkpoint.empty()) {
      return "output_dir " + c.output_dir + " already holds a run (trainer_log.jsonl); set overwrite_output_dir: true, resume it, or pick another folder";
    }
    if (!run && !c.overwrite_output_dir) {
      return "output_dir " + c.output_dir + " is not empty and holds no run of ours; pick an empty or new folder (or set overwrite_output_dir: true)";
    }
  }
  fs::create_directories(out, ec);
  if (ec) return "cannot create output_dir " + c.output_dir + ": " + ec.message();
  const std::string lock_path = (out / kLockFile).string();
  lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) return "cannot write output_dir " + c.output_dir + ": " + std::strerror(errno);
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    std::string holder;
    std::ifstream(lock_path) >> holder;
    ::close(lock_fd);
    lock_fd = -1;
    return "output_dir " + c.output_dir + " is in use by another run (process " + (holder.empty() ? "?" : holder) +
           "); wait for it to end or pick another folder";
  }
  remove_unfinished_saves(out.string());  // held by this run now: no save of another is under way
  const std::string pid = std::to_string(getpid()) + "\n";
  if (ftruncate(lock_fd, 0) != 0 || ::write(lock_fd, pid.data(), pid.size()) < 0) {
    // the lock holds without the pid; only the message would lack it
  }
  return "";
}

}  // namespace

OutputDirLock::~OutputDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

std::unique_ptr<OutputDirLock> prepare_output_dir(const TrainConfig& c, comm::Communicator& world) {
  std::string problem;
  int fd = -1;
  if (world.rank() == 0) problem = check_and_create(c, fd);
  auto lock = fd >= 0 ? std::make_unique<OutputDirLock>(fd) : nullptr;
  at::Tensor flag = at::full({1}, problem.empty() ? 0 : 1, at::kInt);
  world.broadcast(flag, 0).wait();
  if (flag.item<int>() != 0) throw UserError(world.rank() == 0 ? problem : "rank 0 could not use output_dir " + c.output_dir);
  return lock;
}

}  // namespace hyperparallel::train
