// hyperparallel train CONFIG.yaml [--key=value ...]: the SFT trainer (src/train/).
// Under a launcher (hyperparallel run, torchrun-style variables, mpirun, Slurm) it is one rank;
// otherwise it starts nproc_per_node local ranks of itself, or trains in this process for 1.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/launch/process_launcher.h"
#include "hyperparallel/platform/host_allocator.h"
#include "hyperparallel/platform/fault_injection.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/train/trainer.h"

namespace hyperparallel::cli {
namespace {

// NNODES / NODE_RANK / MASTER_ADDR / MASTER_PORT, as llamafactory-cli reads them to start
// torchrun on each node: the same command on every node then forms one job.
launch::LaunchSpec llamafactory_nodes() {
  launch::LaunchSpec spec;
  const auto number = [](const char* name, int min_value, int fallback) {
    const char* v = std::getenv(name);
    return v && *v ? parse_int_option(name, v, min_value) : fallback;
  };
  spec.nnodes = number("NNODES", 1, 1);
  spec.node_rank = number("NODE_RANK", 0, 0);
  spec.master_port = number("MASTER_PORT", 1, 0);
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr && *addr) spec.master_addr = addr;
  if (spec.nnodes > 1 && !(addr && *addr)) {
    throw UserError("NNODES=" + std::to_string(spec.nnodes) + " needs MASTER_ADDR (node 0's address) and MASTER_PORT on every node");
  }
  if (spec.node_rank >= spec.nnodes) {
    throw UserError("NODE_RANK=" + std::to_string(spec.node_rank) + " is not below NNODES=" + std::to_string(spec.nnodes));
  }
  if (spec.nnodes > 1 && spec.master_port == 0) throw UserError("NNODES > 1 needs MASTER_PORT (the same free port on node 0 for every node)");
  return spec;
}

}  // namespace

int train_command(const Args& args) {
  std::string config_path;
  std::vector<std::string> overrides;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) == 0) {
      std::string key = a.substr(2);
      if (key.find('=') == std::string::npos) {
        if (i + 1 >= args.size()) throw UserError("command line: --" + key + " needs a value (--" + key + "=VALUE)");
        key += "=" + args[++i];
      }
      // The launcher's spelling is accepted for the one process-count key.
      if (key.rfind("nproc-per-node=", 0) == 0) key = "nproc_per_node=" + key.substr(15);
      overrides.push_back(key);
    } else if (config_path.empty() && a.find('=') == std::string::npos) {
      config_path = a;
    } else if (a.find('=') != std::string::npos && a[0] != '=') {
      overrides.push_back(a);  // LlamaFactory's form: llamafactory-cli train CONFIG.yaml key=value
    } else {
      throw UserError("command line: unexpected argument '" + a + "'; usage: hyperparallel train CONFIG.yaml [--key=value | key=value ...]");
    }
  }
  // LlamaFactory's launch variables (llamafactory-cli hands them to torchrun): the command line wins.
  if (const char* n = std::getenv("NPROC_PER_NODE"); n && *n) overrides.insert(overrides.begin(), std::string("nproc_per_node=") + n);
  if (config_path.empty() && overrides.empty()) {
    throw UserError("usage: hyperparallel train CONFIG.yaml [--key=value ...] (keys in docs/config.md)");
  }
  const train::TrainConfig config = train::load_train_config(config_path, overrides);
  const comm::RendezvousInfo info = comm::rendezvous_info_from_env();
  const char* fault_spec = std::getenv("HP_FAULT_INJECT");
  std::shared_ptr<platform::FaultInjector> faults;
  if (fault_spec) faults = std::make_shared<platform::FaultInjector>(fault_spec);  // checked before ranks start
  const launch::LaunchSpec nodes = llamafactory_nodes();
  if (info.source == "single process" && (config.nproc_per_node > 1 || nodes.nnodes > 1)) {
    launch::LaunchSpec spec = nodes;
    spec.nproc_per_node = static_cast<int>(config.nproc_per_node);
    spec.command = {self_executable(), "train"};
    spec.command.insert(spec.command.end(), args.begin(), args.end());
    spec.prefix_output = false;
    // The ranks' output reaches the terminal through the launcher's pipes: tell rank 0.
    if (isatty(STDOUT_FILENO)) spec.extra_env.emplace_back("HP_PROGRESS_BAR", "1");
    const launch::LaunchResult result = launch::launch_ranks(spec);
    if (!result.summary.empty()) std::cerr << "hyperparallel train: " << result.summary << "\n";
    return result.exit_code;
  }
  platform::CachingHostAllocator::install(platform::CachingHostAllocator::default_limit(info.local_world_size));
  comm::CommOptions options;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(config.comm_timeout_s * 1000));
  options.heartbeat_timeout = std::chrono::milliseconds(static_cast<int64_t>(config.heartbeat_timeout_s * 1000));
  options.faults = faults;
  auto world = comm::init_process_group(info, options);
  std::ostringstream quiet;
  const char* bar = std::getenv("HP_PROGRESS_BAR");
  const bool progress_bar = isatty(STDOUT_FILENO) || (bar && std::string(bar) == "1");
  train::run_training(config, world, world->rank() == 0 ? std::cout : quiet, progress_bar);
  return kExitOk;
}

}  // namespace hyperparallel::cli
