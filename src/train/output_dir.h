// The run's output folder, checked and claimed by rank 0 before anything is written, with the
// verdict shared by every rank (one broadcast), so all stop with the same error:
//   - never one of the run's input folders (the model, the tokenizer, dataset_dir), nor
//     inside one, nor around one: the export would overwrite model.safetensors in place;
//   - a folder that holds a previous run (trainer_log.jsonl, train_summary.json, checkpoints)
//     only with overwrite_output_dir or a resume; any other non-empty folder only with
//     overwrite_output_dir;
//   - locked for the run (flock on output_dir/.hyperparallel.lock): a second run into the same
//     folder fails at once, naming the process that holds it.
#pragma once

#include <memory>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/train/train_config.h"

namespace hyperparallel::train {

// Held by rank 0 for the run; released when destroyed (or when the process ends).
class OutputDirLock {
 public:
  explicit OutputDirLock(int fd) : fd_(fd) {}
  ~OutputDirLock();
  OutputDirLock(const OutputDirLock&) = delete;
  OutputDirLock& operator=(const OutputDirLock&) = delete;

 private:
  int fd_;
};

// Collective. Returns the lock on rank 0, null elsewhere; UserError on every rank otherwise.
std::unique_ptr<OutputDirLock> prepare_output_dir(const TrainConfig& c, comm::Communicator& world);

}  // namespace hyperparallel::train
