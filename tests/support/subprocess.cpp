#include "subprocess.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace hyperparallel::testing {

SubprocessResult run_subprocess(const std::vector<std::string>& argv, const SubprocessOptions& options) {
  SubprocessResult result;
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return result;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    for (const auto& k : options.unset_env) unsetenv(k.c_str());
    for (const auto& [k, v] : options.env) setenv(k.c_str(), v.c_str(), 1);
    if (!options.working_dir.empty() && chdir(options.working_dir.c_str()) != 0) _exit(126);
    dup2(out[1], 1);
    dup2(out[1], 2);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  bool signalled = false;
  bool open = true;
  while (open) {
    const auto elapsed = std::chrono::steady_clock::now() - start;
    if (options.signal_when && !signalled) {
      int seen = 0;
      for (size_t at = result.output.find(options.signal_when->text); at != std::string::npos;
           at = result.output.find(options.signal_when->text, at + 1)) {
        ++seen;
      }
      if (seen >= options.signal_when->count) {
        if (!options.signal_when->also_processes_with.empty()) {
          for (int other : processes_with(options.signal_when->also_processes_with)) kill(other, options.signal_when->signal);
        }
        kill(pid, options.signal_when->signal);
        signalled = true;
      }
    }
    if (elapsed > options.limit) {
      killpg(pid, SIGKILL);
      result.output += "\n<run_subprocess: killed after the limit>\n";
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 50) > 0) {
      char buf[4096];
      const ssize_t n = read(out[0], buf, sizeof(buf));
      if (n > 0) result.output.append(buf, static_cast<size_t>(n));
      if (n == 0) open = false;
    }
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::vector<int> processes_with(const std::string& marker) {
  std::vector<int> pids;
  DIR* proc = opendir("/proc");
  if (!proc) return pids;
  while (dirent* e = readdir(proc)) {
    const int pid = std::atoi(e->d_name);
    if (pid <= 0 || pid == getpid()) continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/cmdline");
    std::stringstream text;
    text << f.rdbuf();
    std::string cmdline = text.str();
    for (char& c : cmdline) c = c == '\0' ? ' ' : c;
    if (cmdline.find(marker) != std::string::npos) pids.push_back(pid);
  }
  closedir(proc);
  return pids;
}

const char* cli_path() {
  static const std::string path = [] {
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) throw std::runtime_error("cannot read /proc/self/exe: " + ec.message());
    return (self.parent_path().parent_path() / "hyperparallel").string();
  }();
  return path.c_str();
}

}  // namespace hyperparallel::testing
