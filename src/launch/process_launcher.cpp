#include "hyperparallel/launch/process_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>

#include "hyperparallel/launch/free_port.h"
#include "hyperparallel/platform/user_error.h"

extern char** environ;

namespace hyperparallel::launch {
namespace {

// Signal handlers can only reach static storage: the launcher records the signal here and
// its loop (which wakes every 50 ms) forwards it to the ranks.
volatile sig_atomic_t g_received_signal = 0;

void on_launcher_signal(int sig) { g_received_signal = sig; }

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

using Clock = std::chrono::steady_clock;

struct OutputStream {
  int fd = -1;
  int target = 1;  // our fd to relay to
  std::string pending;
};

struct Child {
  RankOutcome outcome;
  bool running = false;
  OutputStream out, err;
};

void write_all(int fd, const std::string& text) {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own output is gone; keep supervising the ranks
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// Reads what is available; relays complete lines with the prefix. Returns false at EOF.
bool relay(OutputStream& s, const std::string& prefix, bool flush_partial) {
  char buf[65536];
  bool open = true;
  for (;;) {
    const ssize_t n = read(s.fd, buf, sizeof(buf));
    if (n > 0) {
      s.pending.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) open = false;
    break;  // EAGAIN or EOF
  }
  std::string out;
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    out += prefix;
    out.append(s.pending, start, nl - start + 1);
  }
  s.pending.erase(0, start);
  if ((!open || flush_partial) && !s.pending.empty()) {
    out += prefix + s.pending + "\n";
    s.pending.clear();
  }
  if (!out.empty()) write_all(s.target, out);
  return open;
}

std::vector<std::string> child_environment(const LaunchSpec& spec, int rank, int local_rank, int port,
                                           int store_listen_fd) {
  std::map<std::string, std::string> set = {
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(spec.nproc_per_node * spec.nnodes)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(spec.nproc_per_node)},
      {"GROUP_RANK", std::to_string(spec.node_rank)},
      {"MASTER_ADDR", spec.master_addr},
      {"MASTER_PORT", std::to_string(port)},
  };
  // N ranks on one machine each default to a thread per core for OpenMP and OpenBLAS, which
  // oversubscribes the cores N times; give each rank its share unless the user chose.
  const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  const std::string share = std::to_string(std::max(1L, cores / spec.nproc_per_node));
  for (const char* var : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
    if (!std::getenv(var)) set[var] = share;
  }
  for (const auto& [k, v] : spec.extra_env) set[k] = v;
  if (store_listen_fd >= 0) set[kStoreListenFdVar] = std::to_string(store_listen_fd);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    const std::string key = entry.substr(0, entry.find('='));
    // A socket handed to this process by an outer launcher is not its children's.
    if (!set.count(key) && key != kStoreListenFdVar) env.push_back(entry);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  return env;
}

void validate(const LaunchSpec& spec) {
  if (spec.nproc_per_node < 1) throw std::invalid_argument("--nproc-per-node must be >= 1");
  if (spec.nnodes < 1) throw std::invalid_argument("--nnodes must be >= 1");
  if (spec.node_rank < 0 || spec.node_rank >= spec.nnodes) {
    throw std::invalid_argument("--node-rank " + std::to_string(spec.node_rank) + " must be in [0, " +
                                std::to_string(spec.nnodes) + ")");
  }
  if (spec.command.empty()) throw std::invalid_argument("no command to run; put it after '--'");
  if (spec.master_port < 0 || spec.master_port > 65535) {
    throw std::invalid_argument("--master-port " + std::to_string(spec.master_port) + " is not a TCP port");
  }
  if (spec.nnodes > 1 && spec.master_port == 0) {
    throw std::invalid_argument("--nnodes " + std::to_string(spec.nnodes) +
                                " needs --master-port: every node must use the same one");
  }
  if (spec.nnodes > 1 && spec.master_addr.empty()) {
    throw std::invalid_argument("--nnodes > 1 needs --master-addr (the address of node 0)");
  }
}

// inherit_fd: a descriptor the child keeps across exec (-1: none); every other one of the
// launcher's descriptors is close-on-exec.
pid_t spawn(const LaunchSpec& spec, const std::vector<std::string>& env, int inherit_fd, Child& child) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe failed: ") + std::strerror(errno));
  }
  std::vector<char*> argv, envp;
  for (const auto& a : spec.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    // Child: only async-signal-safe calls from here to exec.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(125);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(out[1], 1);
    dup2(err[1], 2);
    if (inherit_fd >= 0) fcntl(inherit_fd, F_SETFD, 0);
    environ = envp.data();
    execvp(argv[0], argv.data());
    const char* msg = "hyperparallel run: cannot execute the command: ";
    (void)!write(2, msg, strlen(msg));
    (void)!write(2, argv[0], strlen(argv[0]));
    (void)!write(2, "\n", 1);
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so no signal can race the child's own setpgid
  close(out[1]);
  close(err[1]);
  child.out = {out[0], 1, {}};
  child.err = {err[0], 2, {}};
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  return pid;
}

}  // namespace

std::string RankOutcome::describe() const {
  std::string text = "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ")";
  if (signaled) return text + " was killed by signal " + std::to_string(signal) + " (" + signal_name(signal) + ")";
  return text + " exited with code " + std::to_string(exit_code);
}

// A failing rank is often the consequence of another's: a rank whose peer has gone dies by
// SIGPIPE or fails its next collective (rank 0's store closes while it unwinds from a user
// error, before it has exited). So a failure waits a moment for its root cause before it is
// named: a user error (exit 2) is named at once and outranks any failure before it; a
// failure outranks a SIGPIPE death. How long each kind waits:
constexpr std::chrono::seconds kSigpipeGrace{2};
constexpr std::chrono::seconds kFailureGrace{3};

namespace {

// 2: a user error, the root cause of whatever followed; 1: a failure; 0: a SIGPIPE death.
int root_cause_rank(const RankOutcome& o) {
  if (o.signaled) return o.signal == SIGPIPE ? 0 : 1;
  return o.exit_code == kExitUserError ? 2 : 1;
}

}  // namespace

LaunchResult launch_ranks(const LaunchSpec& spec_in) {
  LaunchSpec spec = spec_in;
  validate(spec);
  // A port the launcher picks stays bound until rank 0 serves it (see free_port.h).
  ReservedPort reserved;
  if (spec.master_port == 0) {
    reserved = ReservedPort::on(spec.master_addr);
    spec.master_port = reserved.fd() >= 0 ? reserved.port() : find_free_port();
  }

  struct sigaction action {}, old_int{}, old_term{}, old_pipe{};
  action.sa_handler = on_launcher_signal;
  sigemptyset(&action.sa_mask);
  g_received_signal = 0;
  sigaction(SIGINT, &action, &old_int);
  sigaction(SIGTERM, &action, &old_term);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &old_pipe);

  LaunchResult result;
  std::vector<Child> children(spec.nproc_per_node);
  for (int local = 0; local < spec.nproc_per_node; ++local) {
    Child& c = children[local];
    c.outcome.rank = spec.node_rank * spec.nproc_per_node + local;
    const int store_fd = c.outcome.rank == 0 ? reserved.fd() : -1;
    c.outcome.pid = spawn(spec, child_environment(spec, c.outcome.rank, local, spec.master_port, store_fd), store_fd, c);
    c.running = true;
  }
  reserved = ReservedPort{};  // rank 0 holds the listening socket now

  const auto start = Clock::now();
  bool stopping = false;
  bool killed = false;
  Clock::time_point kill_at{};
  std::optional<Clock::time_point> pipes_deadline;
  std::optional<RankOutcome> candidate;  // the failure to name, once its grace has passed
  Clock::time_point candidate_deadline{};
  auto stop_all = [&](int sig) {
    for (auto& c : children) {
      if (!c.running) continue;
      killpg(c.outcome.pid, sig);
      if (sig != SIGKILL) killpg(c.outcome.pid, SIGCONT);  // a stopped (frozen) rank must see it too
      c.outcome.stopped_by_launcher = true;
    }
    if (!stopping) kill_at = Clock::now() + spec.kill_grace;
    stopping = true;
  };

  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<OutputStream*, int>> owners;
    for (auto& c : children) {
      for (OutputStream* s : {&c.out, &c.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        owners.emplace_back(s, c.outcome.rank);
      }
    }
    bool any_running = false;
    for (auto& c : children) any_running |= c.running;
    if (!any_running && fds.empty()) break;
    poll(fds.data(), fds.size(), 50);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      OutputStream* s = owners[i].first;
      const std::string prefix = spec.prefix_output ? "[rank " + std::to_string(owners[i].second) + "] " : "";
      if (!relay(*s, prefix, false)) {
        close(s->fd);
        s->fd = -1;
      }
    }

    for (auto& c : children) {
      if (!c.running) continue;
      int status = 0;
      const pid_t r = waitpid(c.outcome.pid, &status, WNOHANG);
      if (r != c.outcome.pid) continue;
      c.running = false;
      c.outcome.signaled = WIFSIGNALED(status);
      c.outcome.signal = c.outcome.signaled ? WTERMSIG(status) : 0;
      c.outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
      killpg(c.outcome.pid, SIGKILL);  // whatever the rank left behind in its group
      if (c.outcome.ok() || stopping) continue;
      const int cause = root_cause_rank(c.outcome);
      if (candidate && cause <= root_cause_rank(*candidate)) continue;  // the earlier one stays
      const auto now = Clock::now();
      const auto deadline = cause == 2 ? now : now + (cause == 0 ? kSigpipeGrace : kFailureGrace);
      candidate_deadline = candidate ? std::min(candidate_deadline, deadline) : deadline;
      candidate = c.outcome;
    }
    if (candidate && !stopping && Clock::now() >= candidate_deadline) {
      result.first_failure = candidate;
      stop_all(SIGTERM);
    }

    if (g_received_signal != 0 && result.launcher_signal == 0) {
      result.launcher_signal = g_received_signal;
      stop_all(g_received_signal);
    }
    if (spec.time_limit && !stopping && Clock::now() - start > *spec.time_limit) {
      result.timed_out = true;
      stop_all(SIGTERM);
    }
    if (stopping && !killed && Clock::now() >= kill_at) {
      stop_all(SIGKILL);
      killed = true;
    }
    bool still_running = false;
    for (auto& c : children) still_running |= c.running;
    if (!still_running) {
      // A rank's background descendants could hold a pipe open forever; give them a second.
      if (!pipes_deadline) pipes_deadline = Clock::now() + std::chrono::seconds(1);
      if (Clock::now() >= *pipes_deadline) {
        for (auto& c : children) {
          for (OutputStream* s : {&c.out, &c.err}) {
            if (s->fd < 0) continue;
            relay(*s, spec.prefix_output ? "[rank " + std::to_string(c.outcome.rank) + "] " : "", true);
            close(s->fd);
            s->fd = -1;
          }
        }
      }
    }
  }

  if (!result.first_failure && candidate) result.first_failure = candidate;  // every other rank ended first
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGPIPE, &old_pipe, nullptr);

  for (auto& c : children) result.ranks.push_back(c.outcome);
  const int others = spec.nproc_per_node - 1;
  if (result.first_failure) {
    const RankOutcome& f = *result.first_failure;
    result.exit_code = f.signaled ? 128 + f.signal : f.exit_code;
    result.summary = f.describe() + (others > 0 ? "; stopped the other " + std::to_string(others) + " local rank(s)" : "");
  } else if (result.launcher_signal) {
    result.exit_code = 128 + result.launcher_signal;
    result.summary = "received " + signal_name(result.launcher_signal) + "; stopped all " +
                     std::to_string(spec.nproc_per_node) + " local rank(s)";
  } else if (result.timed_out) {
    result.exit_code = 124;
    result.summary = "time limit of " + std::to_string(spec.time_limit->count() / 1000) +
                     " s reached; stopped all " + std::to_string(spec.nproc_per_node) + " local rank(s)";
  }
  return result;
}

}  // namespace hyperparallel::launch
