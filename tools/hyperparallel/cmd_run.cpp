// hyperparallel run: the launcher command (src/launch/process_launcher.cpp does the work).
#include <unistd.h>

#include <climits>
#include <iostream>
#include <stdexcept>

#include "commands.h"
#include "hyperparallel/launch/process_launcher.h"

namespace hyperparallel::cli {

std::string self_executable() {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) throw std::runtime_error("cannot find the path of the running executable");
  path[n] = '\0';
  return path;
}

bool take_option(const Args& args, size_t& i, const std::string& name, std::string& value) {
  const std::string& a = args[i];
  if (a == name) {
    if (i + 1 >= args.size()) throw std::invalid_argument(name + " needs a value");
    value = args[++i];
    return true;
  }
  if (a.rfind(name + "=", 0) == 0) {
    value = a.substr(name.size() + 1);
    return true;
  }
  return false;
}

int parse_int_option(const std::string& name, const std::string& value, int min_value) {
  size_t used = 0;
  int parsed = 0;
  try {
    parsed = std::stoi(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty() || parsed < min_value) {
    throw std::invalid_argument(name + " '" + value + "' is not an integer >= " + std::to_string(min_value));
  }
  return parsed;
}

int run_command(const Args& args) {
  launch::LaunchSpec spec;
  bool addr_given = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    std::string v;
    if (args[i] == "--") {
      ++i;
      break;
    }
    if (take_option(args, i, "--nproc-per-node", v) || take_option(args, i, "--nproc_per_node", v)) {
      spec.nproc_per_node = parse_int_option("--nproc-per-node", v, 1);
    } else if (take_option(args, i, "--nnodes", v)) {
      spec.nnodes = parse_int_option("--nnodes", v, 1);
    } else if (take_option(args, i, "--node-rank", v) || take_option(args, i, "--node_rank", v)) {
      spec.node_rank = parse_int_option("--node-rank", v, 0);
    } else if (take_option(args, i, "--master-addr", v) || take_option(args, i, "--master_addr", v)) {
      spec.master_addr = v;
      addr_given = true;
    } else if (take_option(args, i, "--master-port", v) || take_option(args, i, "--master_port", v)) {
      spec.master_port = parse_int_option("--master-port", v, 1);
    } else if (take_option(args, i, "--rdzv-endpoint", v) || take_option(args, i, "--rdzv_endpoint", v)) {
      // torchrun's spelling of a static rendezvous: HOST[:PORT] of node 0's store.
      const size_t colon = v.rfind(':');
      spec.master_addr = v.substr(0, colon);
      if (colon != std::string::npos) spec.master_port = parse_int_option("--rdzv-endpoint's port", v.substr(colon + 1), 0);
      if (spec.master_addr.empty()) throw std::invalid_argument("--rdzv-endpoint '" + v + "' has no host; use HOST:PORT");
      addr_given = true;
    } else if (take_option(args, i, "--rdzv-backend", v) || take_option(args, i, "--rdzv_backend", v)) {
      if (v != "static" && v != "c10d") throw std::invalid_argument("--rdzv-backend " + v + " is not supported; static and c10d are (a fixed set of nodes)");
    } else if (take_option(args, i, "--rdzv-id", v) || take_option(args, i, "--rdzv_id", v)) {
      // A job id for elastic rendezvous; a static job needs none.
    } else if (args[i] == "--standalone") {
      // torchrun --standalone: one node, a local store on a free port — this launcher's default.
      if (spec.nnodes > 1) throw std::invalid_argument("--standalone is a single-node job; drop --nnodes");
    } else if (take_option(args, i, "--time-limit-s", v)) {
      spec.time_limit = std::chrono::seconds(parse_int_option("--time-limit-s", v, 1));
    } else if (args[i] == "--no-prefix") {
      spec.prefix_output = false;
    } else if (args[i].rfind("--", 0) == 0) {
      throw std::invalid_argument("unknown option " + args[i] +
                                  "; options: --nproc-per-node --nnodes --node-rank --master-addr --master-port "
                                  "--rdzv-endpoint --rdzv-backend --rdzv-id --standalone --time-limit-s --no-prefix, then -- CMD ...");
    } else {
      break;  // the command starts here
    }
  }
  spec.command.assign(args.begin() + static_cast<long>(i), args.end());
  if (spec.nnodes > 1 && !addr_given) {
    throw std::invalid_argument("--nnodes " + std::to_string(spec.nnodes) + " needs --master-addr (node 0's address)");
  }
  const launch::LaunchResult result = launch::launch_ranks(spec);
  if (!result.summary.empty()) std::cerr << "hyperparallel run: " << result.summary << "\n";
  return result.exit_code;
}

}  // namespace hyperparallel::cli
