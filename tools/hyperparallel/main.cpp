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

constexpr const char* kUsage =
    "usage: hyperparallel <command> [options]\n"
    "\n"
    "commands:\n"
    "  run --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P] -- CMD ...\n"
    "        start N local ranks of CMD with torchrun's environment\n"
    "  selfcheck [--nproc-per-node N] [--size-mib S]\n"
    "        check every collective for exactness on N local ranks (default 4) and print bandwidth\n"
    "  tokenize --model DIR [--jsonl] [--decode] [--add-special-tokens]\n"
    "        stdin lines to token ids (JSON arrays) with DIR's tokenizer.json, or back with --decode\n"
    "  train CONFIG.yaml [--key=value | --section.key=value ...]\n"
    "        fine-tune a Hugging Face model as the YAML says (keys: docs/config.md); starts\n"
    "        nproc_per_node local ranks itself, or runs as one rank under a launcher\n"
    "  train-tokenizer --dataset NAMES --out DIR [--dataset-dir D] [--template T] [--vocab-size N]\n"
    "        learn a byte-level BPE tokenizer.json from datasets rendered by a chat template\n"
    "  export CHECKPOINT OUT_DIR [--dtype float32|bfloat16] [--overwrite]\n"
    "        write a training checkpoint (any layout) as a Hugging Face model folder\n"
    "  generate --model DIR --prompt TEXT [--template T] [--system S] [--max-new-tokens N]\n"
    "           [--temperature T] [--seed S] [--thinking]\n"
    "        answer one prompt with a model folder (greedy by default, KV cache)\n"
    "  help  show this text\n";

bool is_secondary_rank() {
  const char* rank = std::getenv("RANK");
  return rank && std::strcmp(rank, "0") != 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace hyperparallel;
  if (argc < 2 || std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0 ||
      std::strcmp(argv[1], "-h") == 0) {
    std::cout << kUsage;
    return argc < 2 ? kExitUserError : kExitOk;
  }
  // A write to a peer that has gone must be an error (EPIPE) the code reports, not a signal
  // that kills this rank and hides the rank that failed first (Python, where PyTorch runs,
  // ignores SIGPIPE the same way).
  std::signal(SIGPIPE, SIG_IGN);
  const std::string command = argv[1];
  cli::Args args(argv + 2, argv + argc);
  try {
    if (command != "run" && command != "tokenize" && command != "train-tokenizer" && command != "generate" &&
        command != "export" && !is_secondary_rank()) std::cerr << platform::reference_blas_warning();
    if (command == "run") return cli::run_command(args);
    if (command == "selfcheck") return cli::selfcheck_command(args);
    if (command == "tokenize") return cli::tokenize_command(args);
    if (command == "train") return cli::train_command(args);
    if (command == "train-tokenizer") return cli::train_tokenizer_command(args);
    if (command == "export") return cli::export_command(args);
    if (command == "generate") return cli::generate_command(args);
    std::cerr << "hyperparallel: unknown command '" << command << "'\n\n" << kUsage;
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
