// hyperparallel: command-line entry. Thin: parse the subcommand, call it, map errors to
// exit codes (2 = user error, 1 = failure).
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>

#include "commands.h"
#include "hyperparallel/comm/comm_handle.h"
#include "hyperparallel/platform/blas_check.h"
#include "hyperparallel/platform/user_error.h"

namespace {

bool is_secondary_rank() {
  const char* rank = std::getenv("RANK");
  return rank && std::strcmp(rank, "0") != 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace hyperparallel;
  if (argc < 2) {
    std::cerr << cli::usage_text();
    return kExitUserError;
  }
  if (std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    // `hyperparallel help train` is `hyperparallel train --help`.
    return cli::help_command(argc > 2 ? argv[2] : "", {}, std::cout);
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::cout << cli::version_text();
    return kExitOk;
  }
  // A write to a peer that has gone must be an error (EPIPE) the code reports, not a signal
  // that kills this rank and hides the rank that failed first (Python, where PyTorch runs,
  // ignores SIGPIPE the same way).
  std::signal(SIGPIPE, SIG_IGN);
  const std::string command = argv[1];
  cli::Args args(argv + 2, argv + argc);
  // run's own options end where the command starts; only a leading --help is run's.
  if (cli::is_help_or_version(args, command == "run" ? 1 : args.size())) return cli::help_command(command, args, std::cout);
  try {
    if (command != "run") platform::configure_compute_threads();
    if (command != "run" && command != "tokenize" && command != "train-tokenizer" && command != "generate" &&
        command != "export" && !is_secondary_rank()) std::cerr << platform::reference_blas_warning();
    if (command == "run") return cli::run_command(args);
    if (command == "selfcheck") return cli::selfcheck_command(args);
    if (command == "tokenize") return cli::tokenize_command(args);
    if (command == "train") return cli::train_command(args);
    if (command == "train-tokenizer") return cli::train_tokenizer_command(args);
    if (command == "export") return cli::export_command(args);
    if (command == "generate") return cli::generate_command(args);
    std::cerr << "hyperparallel: unknown command '" << command << "'\n\n" << cli::usage_text();
    return kExitUserError;
  } catch (const UserError& e) {
    std::cerr << "hyperparallel " << command << ": error: " << e.what() << "\n";
    return kExitUserError;
  } catch (const std::invalid_argument& e) {
    std::cerr << "hyperparallel " << command << ": error: " << e.what() << "\n";
    return kExitUserError;
  } catch (const std::exception& e) {
    std::cerr << "hyperparallel " << command << ": failed: " << e.what() << "\n";
    return kExitFailure;
  }
}
