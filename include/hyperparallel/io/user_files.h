// Reading files a user points us at (config.json, tokenizer.json, datasets, index files,
// checkpoint metadata) without letting one hang, exhaust memory or overflow the stack:
//   - only regular files: a FIFO would block open() forever and /dev/zero never ends, so
//     anything else is refused before it is opened (and opened non-blocking, in case it is
//     swapped in between);
//   - a size cap per kind of file, checked before reading;
//   - JSON nesting bounded before the (recursive) parser sees the text, so 100 000 '[' is a
//     one-line error, not a stack overflow, and nothing read back is deeper than the bound
//     (dumping it again is safe too).
// Every failure is a UserError naming the file and the limit.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

namespace hyperparallel::io {

inline constexpr int kMaxUserJsonDepth = 128;
inline constexpr uint64_t kMaxSmallJsonBytes = 64ull << 20;  // config.json, tokenizer_config.json, indexes
inline constexpr uint64_t kMaxTokenizerBytes = 1ull << 30;   // tokenizer.json (large vocabularies are ~30 MB)
inline constexpr uint64_t kMaxDatasetBytes = 64ull << 30;    // one dataset file

// A read-only descriptor of the regular file `path` and its size, checked as above (the kind
// before it is opened, non-blocking); the caller closes fd. UserError naming `what` and the file.
struct OpenedFile {
  int fd = -1;
  uint64_t size = 0;
};
OpenedFile open_user_file(const std::string& path, const std::string& what);

// The file's bytes. `what` names it for messages ("config.json", "the dataset").
std::string read_user_file(const std::string& path, uint64_t max_bytes, const std::string& what);

// Parses `text` (from `where`, for messages) as JSON nested at most `max_depth` levels.
nlohmann::json parse_user_json(const std::string& text, const std::string& where, int max_depth = kMaxUserJsonDepth);

// Both in one: a regular file of at most `max_bytes` holding bounded JSON.
nlohmann::json read_user_json(const std::string& path, uint64_t max_bytes, const std::string& what);

// Whether `text` nests '{' / '[' at most `limit` deep (brackets inside strings do not count).
bool json_nesting_within(const char* text, uint64_t length, int limit);

}  // namespace hyperparallel::io
