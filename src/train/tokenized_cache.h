// Tokenizing once per job: where a job's tokenized rows live, and who makes them.
//
// Rows (data/token_rows.h) are saved in a file that every rank memory-maps, so the ranks of
// a machine share one copy in the page cache. The file is one of:
//   - a cache entry, TOKENIZED_CACHE_DIR/<key>.hprows, the key hashing everything the rows
//     depend on: the dataset files' bytes (and dataset_info.json), tokenizer.json and
//     tokenizer_config.json, the template and its options, stage, cutoff_len, packing,
//     max_samples, bad_records, and kRowsRevision (raised whenever a change to the code makes
//     other rows from the same inputs). A second run with the same inputs reads the entry.
//   - LlamaFactory's tokenized_path: FOLDER/train.hprows (and eval.hprows), saved by the first
//     run and read by later ones whatever their dataset keys say (as LlamaFactory does).
// Who makes it: whoever holds an exclusive flock(2) on PATH.lock first; the other ranks of
// the machine block on the lock and then map what it wrote. A rank that dies releases its
// lock, and the next one builds. No collective is needed, and ranks on machines that do not
// share the folder each make their own copy, once per machine.
// overwrite_cache: an entry older than this process's call is made again (ranks of one job
// call within milliseconds of each other, after a collective; the first rebuilds, the rest
// see a fresh file).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hyperparallel/data/dataset_registry.h"
#include "hyperparallel/data/token_rows.h"
#include "hyperparallel/train/train_config.h"

namespace hyperparallel::train {

// Raise when the same inputs would give other rows (tokenizer, templates, samples, packing).
inline constexpr int64_t kRowsRevision = 1;

// tokenized_cache_dir resolved: "" -> $XDG_CACHE_HOME/hyperparallel/tokenized, else
// $HOME/.cache/hyperparallel/tokenized; "none" -> "" (no cache).
std::string tokenized_cache_dir(const std::string& configured);

// What rows of `datasets` (and `file`) depend on besides bytes of files: stage, template and
// its options, cutoff_len, packing, ... Kept in each file's meta; compared when tokenized_path
// is read, so a folder made with other settings is named.
nlohmann::json rows_settings(const TrainConfig& config, const std::string& datasets, const data::DatasetFile* file);

// The cache key: `settings`, kRowsRevision, and the bytes of `files` (tokenizer and dataset
// files, in order). 32 hex digits.
std::string rows_key(const nlohmann::json& settings, const std::vector<std::string>& files);

// Threads that tokenize: `configured`, else the cores this process may run on.
int tokenizing_threads(const std::optional<int64_t>& configured);

// How a file of rows came to be, for the banner.
enum class RowsOrigin { kBuiltInMemory, kBuiltAndSaved, kReadFromFile };

struct SavedRows {
  data::TokenRows rows;
  RowsOrigin origin = RowsOrigin::kBuiltInMemory;
  std::string path;  // the file, "" in memory
};

// The rows at `path`: mapped when the file is there (and, with `rebuild_before`, written
// after it), else made by `build`, saved there and mapped; all under PATH.lock. A file that
// is there but unusable is made again (its error is reported on `notes`).
SavedRows load_or_build_rows(const std::string& path, std::optional<std::chrono::system_clock::time_point> rebuild_before,
                             const std::function<data::TokenRows()>& build, std::vector<std::string>& notes);

// Holds flock(LOCK_EX) on a file (created if missing) until destroyed. UserError when the
// file cannot be opened, unless `only_if_writable` and the folder is read-only: then no lock
// is held (a read-only folder of rows is read, never written).
class FileLock {
 public:
  explicit FileLock(const std::string& path, bool only_if_writable = false);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace hyperparallel::train
