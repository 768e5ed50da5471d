// Tokenizer throughput, single thread: ~5 MB made by repeating the reference corpus lines
// joined with '\n' (as the fixture README measures the reference), one encode() call on the
// whole text, best of 3; MB = 10^6 bytes. Also writes the text to a file so the Hugging Face
// reference can encode the very same bytes in the same run (scripts/bench_tokenizer.sh).
//   tokenizer_bench TOKENIZER_DIR CORPUS_JSONL TEXT_OUT
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hyperparallel/data/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: tokenizer_bench TOKENIZER_DIR CORPUS_JSONL TEXT_OUT\n");
    return 2;
  }
  std::ifstream in(argv[2], std::ios::binary);
  std::stringstream all;
  all << in.rdbuf();
  std::vector<std::string> lines;
  const std::string corpus = all.str();
  size_t start = 0;
  for (size_t nl; (nl = corpus.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines.push_back(nlohmann::json::parse(corpus.substr(start, nl - start))["text"].get<std::string>());
  }
  std::string text;
  while (text.size() < 5000000) {
    for (const auto& line : lines) text += line + "\n";
  }
  std::ofstream(argv[3], std::ios::binary | std::ios::trunc) << text;
  const auto tokenizer = hyperparallel::data::Tokenizer::from_file(argv[1]);
  double best = 1e9;
  size_t ids = 0;
  for (int round = 0; round < 3; ++round) {
    const auto t = std::chrono::steady_clock::now();
    ids = tokenizer.encode(text).size();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
  }
  std::printf("RESULT impl=hyperparallel bytes=%zu ids=%zu seconds=%.3f mb_per_s=%.2f\n", text.size(), ids, best, text.size() / best / 1e6);
  return 0;
}
