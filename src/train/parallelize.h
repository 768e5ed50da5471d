// The trainer's layout and the one function that makes a model parallel, in the documented
// order: tensor parallelism, then (context parallelism and activation checkpointing, later)
// FSDP/HSDP over the data-parallel axes — as torchtitan's parallelize does.
//
// The mesh is (dp_replicate, dp_shard, tp) over the world, consecutive ranks sharing a tp
// group, with size-1 axes left out (dp_shard always kept: FSDP needs a mesh). tp ranks share
// each batch; the sampler and the loss go over the dp axes; FSDP shards each rank's tensor-
// parallel pieces over dp_shard and replicates over dp_replicate.
#pragma once

#include <memory>
#include <vector>

#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/mesh/parallel_dims.h"
#include "hyperparallel/train/train_config.h"

namespace hyperparallel::models {
class CausalLM;
}

namespace hyperparallel::train {

struct ParallelLayout {
  mesh::ParallelDims dims;  // resolved
  mesh::DeviceMesh mesh;    // (dp_replicate?, dp_shard, tp?)
  mesh::DeviceMesh dp_mesh;  // FSDP's: dp_shard, or (dp_replicate, dp_shard)
  int64_t dp() const { return dims.dp(); }
  int64_t dp_rank() const { return dp_mesh.rank(); }
  int64_t tp() const { return dims.tp; }
};

// From accelerator.tp_size and fsdp_config.dp_shard_size; UserError with the numbers when
// they do not divide the world.
ParallelLayout build_layout(const TrainConfig& c, const std::shared_ptr<comm::Communicator>& world);

struct ParallelModel {
  std::vector<fsdp::FSDPModule> units;  // decoder layers, then the root (last)
};

// TP (accelerator.tp_size > 1), then FSDP over layout.dp_mesh.
ParallelModel parallelize(models::CausalLM& model, const ParallelLayout& layout, const TrainConfig& c);

}  // namespace hyperparallel::train
