// The subcommands of the hyperparallel tool. Each takes the arguments after its name and
// returns the process exit code; UserError / std::invalid_argument escaping from one becomes
// exit code 2 in main.cpp.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace hyperparallel::cli {

using Args = std::vector<std::string>;

int run_command(const Args& args);        // hyperparallel run --nproc-per-node N -- CMD ...
int selfcheck_command(const Args& args);  // hyperparallel selfcheck [--nproc-per-node N]
int tokenize_command(const Args& args);   // hyperparallel tokenize --model DIR [--jsonl] [--decode]
int train_command(const Args& args);            // hyperparallel train CONFIG.yaml [--key=value ...]
int train_tokenizer_command(const Args& args);  // hyperparallel train-tokenizer --dataset NAMES --out DIR
int export_command(const Args& args);           // hyperparallel export CHECKPOINT OUT_DIR
int generate_command(const Args& args);         // hyperparallel generate --model DIR --prompt TEXT

// help.cpp: the overview, the version line, and CMD --help (train adds its config keys).
std::string usage_text();
std::string version_text();
// Whether one of args[0, end) is --help, -h or --version.
bool is_help_or_version(const Args& args, size_t end);
int help_command(const std::string& command, const Args& args, std::ostream& out);

// Path of the running executable (for commands that start more of themselves).
std::string self_executable();

// "--name value" or "--name=value" at args[i]; advances i past the value.
bool take_option(const Args& args, size_t& i, const std::string& name, std::string& value);
int parse_int_option(const std::string& name, const std::string& value, int min_value);

}  // namespace hyperparallel::cli
