// The tool's help: one entry per subcommand (synopsis and what it does), `hyperparallel help`,
// `hyperparallel CMD --help` and `--version`. `train --help` adds every config key with its
// type, default and meaning, from the same table docs/config.md is written from.
#include <iostream>

#include "commands.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/train/train_config.h"

#ifndef HP_VERSION
#error "HP_VERSION comes from the CMake project version"
#endif

namespace hyperparallel::cli {
namespace {

struct CommandHelp {
  const char* name;
  const char* synopsis;
  const char* text;
};

constexpr CommandHelp kCommands[] = {
    {"run", "run --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P] [--standalone] -- CMD ...",
     "start N local ranks of CMD with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,\n"
     "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); the first rank to fail stops the others and\n"
     "its exit code is the job's. --time-limit-s S ends the job after S seconds (exit 124);\n"
     "--no-prefix drops the [rank N] prefix of each output line. torchrun's --rdzv-endpoint\n"
     "HOST:PORT and --standalone are accepted (a static rendezvous at that address / this host)."},
    {"selfcheck", "selfcheck [--nproc-per-node N] [--size-mib S]",
     "check every collective for exactness on N local ranks (default 4) and print bandwidth"},
    {"tokenize", "tokenize --model DIR [--jsonl] [--decode] [--add-special-tokens]",
     "stdin lines to token ids (JSON arrays) with DIR's tokenizer.json, or back with --decode"},
    {"train", "train CONFIG.yaml [--key=value | --section.key=value | key=value ...]",
     "fine-tune a Hugging Face model as the YAML says (LlamaFactory's keys; docs/config.md);\n"
     "starts nproc_per_node local ranks itself (or NPROC_PER_NODE / NNODES ... as\n"
     "llamafactory-cli reads them), or runs as one rank under a launcher"},
    {"train-tokenizer", "train-tokenizer --dataset NAMES --out DIR [--dataset-dir D] [--template T] [--vocab-size N]",
     "learn a byte-level BPE tokenizer.json from datasets rendered by a chat template"},
    {"export", "export CHECKPOINT OUT_DIR [--dtype float32|bfloat16] [--overwrite]",
     "write a training checkpoint (any layout) as a Hugging Face model folder"},
    {"generate",
     "generate --model DIR --prompt TEXT [--template T] [--system S] [--max-new-tokens N]\n"
     "         [--temperature T] [--seed S] [--thinking]",
     "answer one prompt with a model folder (greedy by default, KV cache)"},
};

const CommandHelp* find(const std::string& name) {
  for (const auto& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

void print_keys(std::ostream& out) {
  out << "\nconfig keys (YAML, --key=value or key=value; docs/config.md has the details):\n";
  for (const auto& k : train::config_schema()) {
    out << "  " << k.key << ": " << k.type << " = " << k.default_text << "\n      " << k.doc << "\n";
  }
}

}  // namespace

// One literal, not std::string + char*: g++ 12 at -std=c++20 -O2 reports a false -Warray-bounds
// in the inlined constexpr operator+ (an error under -Werror).
std::string version_text() { return "hyperparallel " HP_VERSION "\n"; }

std::string usage_text() {
  std::string out = "usage: hyperparallel <command> [options]   (hyperparallel <command> --help: its options)\n\ncommands:\n";
  for (const auto& c : kCommands) {
    std::string text = c.text;
    // The overview shows the first line of each description.
    text = text.substr(0, text.find('\n'));
    out += "  " + std::string(c.synopsis) + "\n        " + text + "\n";
  }
  out += "  help | --help      show this text\n  --version          print the version\n";
  return out;
}

bool is_help_or_version(const Args& args, size_t end) {
  for (size_t i = 0; i < end && i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h" || args[i] == "--version") return true;
  }
  return false;
}

int help_command(const std::string& command, const Args& args, std::ostream& out) {
  for (const auto& a : args) {
    if (a == "--version") {
      out << version_text();
      return kExitOk;
    }
  }
  const CommandHelp* c = find(command);
  if (!c) {
    out << usage_text();
    return kExitOk;
  }
  out << "usage: hyperparallel " << c->synopsis << "\n\n" << c->text << "\n";
  if (command == "train") print_keys(out);
  return kExitOk;
}

}  // namespace hyperparallel::cli
