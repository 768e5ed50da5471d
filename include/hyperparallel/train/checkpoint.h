// Training checkpoints: every rank's shards, optimizer state and RNG, plus the run's position,
// written atomically and loadable on the same or another layout.
//
// Layout of output_dir/checkpoint-<step>/:
//   rank-<r>.safetensors  rank r's pieces: "param/<name>" (its N-D box of the parameter),
//                         "exp_avg/<name>", "exp_avg_sq/<name>" (AdamW moments of that box)
//                         and "rng/cpu"; its __metadata__ "shards" is JSON with, per name,
//                         global_shape, offsets, lengths and the AdamW step. Each box is
//                         written once: by the first rank holding it (HSDP replicas and tp
//                         ranks holding the same piece do not write it again)
//   config.json           the model's config (export builds the model from it)
//   tokenizer files       copied from the run's tokenizer folder, so the folder is complete
//   trainer_state.json    written last: step, sampler position, world size, mesh, global
//                         batch, seed, data rows, and each rank file's size and FNV-1a checksum
// The folder is written as checkpoint-<step>.partial and renamed when trainer_state.json is
// in place, so a folder named checkpoint-<step> is complete; save_total_limit then removes the
// oldest. A crash mid-save leaves only a .partial folder, which nothing ever loads.
//
// Loading on the layout that wrote it reads each rank's own pieces. On another layout (world
// size, mesh, tp size, replicate_params) each rank reads the box it now owns from whichever
// files hold it (fully_shard's load_parameters, by boxes), for the parameters and the optimizer
// moments alike. Checksums are verified on every file read; a mismatch is a UserError naming
// the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hyperparallel/comm/communicator.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class AdamW;
}

namespace hyperparallel::train {

struct CheckpointInfo {
  int64_t step = 0;                 // optimizer steps done
  nlohmann::json sampler_position;  // data::GlobalBatchSampler position_json
  int64_t global_batch_rows = 0;
  int64_t data_rows = 0;
  int64_t seed = 0;
  int64_t world_size = 1;
  std::vector<int64_t> mesh_shape;
  std::string model;               // model_name_or_path of the run
  int64_t input_tokens = 0;        // tokens trained on up to this step (all runs it continues)
  std::vector<std::string> file_checksums;  // per rank file, FNV-1a 64 as hex (read only)
};

// What goes next to the shards: the model's config.json text and a tokenizer folder to copy.
struct CheckpointExtras {
  std::string config_json;
  std::string tokenizer_dir;
};

// Collective over `world`. Returns the checkpoint folder. With save_total_limit N > 0 the
// oldest complete checkpoints *before* this step are removed so that N remain; a checkpoint of
// a later step is never removed (it belongs to a run this one did not continue).
std::string save_checkpoint(const std::string& output_dir, const CheckpointInfo& info, const CheckpointExtras& extras,
                            torch::nn::Module& model, torch::optim::AdamW& optimizer, comm::Communicator& world,
                            int64_t save_total_limit);

// "latest" -> the complete checkpoint with the highest step in output_dir; a path -> itself
// after checking it is a complete checkpoint. UserError naming what is missing.
std::string resolve_checkpoint(const std::string& spec, const std::string& output_dir);

// Reads trainer_state.json (UserError if missing or malformed).
CheckpointInfo read_checkpoint_info(const std::string& dir);

// Collective when `model` is sharded over `world` (every rank calls); works for an
// unsharded model too. `optimizer` may be null (export reads parameters only).
CheckpointInfo load_checkpoint(const std::string& dir, torch::nn::Module& model, torch::optim::AdamW* optimizer,
                               int world_rank);

// The complete checkpoints in output_dir, oldest step first.
std::vector<std::string> list_checkpoints(const std::string& output_dir);

// Removes checkpoint-<step>.partial folders: saves that did not finish (a killed job, a full
// disk). Only for the run that holds output_dir (rank 0, after claiming it). Returns them.
std::vector<std::string> remove_unfinished_saves(const std::string& output_dir);

// Resuming at `step` starts a new line of checkpoints: those in output_dir of later steps (a
// run that went on from there) are renamed checkpoint-<s>.superseded-<step> — kept, but no
// longer "latest" and no longer overwritten. Returns the new names. Rank 0 only.
std::vector<std::string> supersede_later_checkpoints(const std::string& output_dir, int64_t step);

}  // namespace hyperparallel::train
