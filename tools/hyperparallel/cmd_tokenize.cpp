// hyperparallel tokenize: text to token ids and back with a model folder's tokenizer.json.
//   hyperparallel tokenize --model DIR [--jsonl] [--decode] [--add-special-tokens]
// Reads stdin one record per '\n'-terminated line. Encoding: each line is a text (with
// --jsonl, a JSON string, so texts may hold newlines) and the output is its ids as a JSON
// array. --decode: each line is a JSON array of ids and the output is the text (a JSON string
// with --jsonl). A malformed line is an error naming its line number.
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "hyperparallel/data/tokenizer.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::cli {

int tokenize_command(const Args& args) {
  std::string model;
  bool jsonl = false, decode = false, add_special = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (take_option(args, i, "--model", model)) continue;
    if (args[i] == "--jsonl") {
      jsonl = true;
    } else if (args[i] == "--decode") {
      decode = true;
    } else if (args[i] == "--add-special-tokens") {
      add_special = true;
    } else {
      throw UserError("unknown option '" + args[i] + "'; usage: tokenize --model DIR [--jsonl] [--decode] [--add-special-tokens]");
    }
  }
  if (model.empty()) throw UserError("--model DIR is required (a folder with tokenizer.json, or the file itself)");
  const auto tokenizer = data::Tokenizer::from_file(model);
  std::string line;
  for (size_t number = 1; std::getline(std::cin, line); ++number) {
    const std::string where = "stdin line " + std::to_string(number);
    nlohmann::json value;
    if (decode || jsonl) {
      try {
        value = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw UserError(where + " is not valid JSON (" + e.what() + ")");
      }
    }
    if (decode) {
      if (!value.is_array()) throw UserError(where + " must be a JSON array of token ids");
      std::vector<int64_t> ids;
      for (const auto& v : value) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= tokenizer.vocab_size()) {
          throw UserError(where + ": " + v.dump() + " is not a token id of this tokenizer (0.." +
                          std::to_string(tokenizer.vocab_size() - 1) + ")");
        }
        ids.push_back(v.get<int64_t>());
      }
      const std::string text = tokenizer.decode(ids);
      std::cout << (jsonl ? nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) : text) << "\n";
    } else {
      if (jsonl && !value.is_string()) throw UserError(where + " must be a JSON string (--jsonl)");
      std::cout << nlohmann::json(tokenizer.encode(jsonl ? value.get<std::string>() : line, add_special)).dump() << "\n";
    }
  }
  return 0;
}

}  // namespace hyperparallel::cli
