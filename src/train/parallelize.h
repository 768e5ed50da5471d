// The trainer's layout and the one function that makes a model parallel, in the documented
// order: tensor parallelism, then (context parallelism and activation checkpointing, later)
// FSDP/HSDP over the data-parallel axes — as torchtitan's parallelize does.
//
// The mesh is (dp_replicate, dp_shard, cp, tp) over the world, consecutive ranks sharing a tp
// group, with size-1 axes left out (dp_shard always kept: FSDP needs a mesh). tp ranks share
// each batch; cp ranks share each row, each holding its zigzag share of the sequence
// (cp/context_parallel.h); the sampler goes over the dp axes, the loss over every rank's
// label tokens; FSDP shards each rank's tensor-parallel pieces over dp_shard x cp (flattened)
// and replicates over dp_replicate.
//
// With accelerator.ep_size > 1 the same ranks are read again as (dp_replicate, edp, ep)
// (mesh/parallel_dims.h): experts are divided over ep (ep/expert_parallel.h) and each
// block's experts are one FSDP unit over edp (or HSDP over (dp_replicate, edp)), while the
// dense layers keep the dense mesh. The experts are not tensor-parallel: where the ep axis
// overlaps tp, the tp ranks split the block's (shared) tokens among them before dispatch.
#pragma once

#include <memory>
#include <optional>
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
  mesh::DeviceMesh mesh;    // (dp_replicate?, dp_shard, cp?, tp?)
  mesh::DeviceMesh data_mesh;  // the ranks that take different rows: dp_shard, or (dp_replicate, dp_shard)
  // FSDP's: the data ranks, with cp folded into the shard axis (cp ranks hold the same
  // parameters): dp_shard·cp, or (dp_replicate, dp_shard·cp).
  mesh::DeviceMesh dp_mesh;
  std::optional<mesh::DeviceMesh> expert_mesh;  // (dp_replicate?, edp, ep) when ep > 1
  std::optional<mesh::DeviceMesh> edp_mesh;     // the experts' FSDP mesh: edp or (dp_replicate, edp)
  int64_t dp() const { return dims.dp(); }
  int64_t dp_rank() const { return data_mesh.rank(); }
  int64_t tp() const { return dims.tp; }
  int64_t cp() const { return dims.cp; }
  int64_t cp_rank() const { return dims.cp > 1 ? mesh.local_rank("cp") : 0; }
};

// From accelerator.tp_size / cp_size / ep_size and fsdp_config.dp_shard_size / edp_shard_size;
// UserError with the numbers when they do not divide the world.
ParallelLayout build_layout(const TrainConfig& c, const std::shared_ptr<comm::Communicator>& world);

struct ParallelModel {
  std::vector<fsdp::FSDPModule> units;  // the experts (with EP), the decoder layers, then the root (last)
};

// activation_checkpoint.mode as gradient_checkpointing / disable_gradient_checkpointing
// (LlamaFactory's spellings) leave it: off | full.
std::string activation_checkpoint_mode(const TrainConfig& c);

// TP (accelerator.tp_size > 1), CP (cp_size > 1: the context-parallel attention), EP (ep_size > 1; UserError when the model has no experts or
// their count does not divide by ep_size), activation checkpointing and chunked loss, then
// FSDP: experts over layout.edp_mesh, the rest over layout.dp_mesh.
ParallelModel parallelize(models::CausalLM& model, const ParallelLayout& layout, const TrainConfig& c);

}  // namespace hyperparallel::train
