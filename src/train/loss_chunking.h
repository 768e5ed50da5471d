// Whether the trainer computes the loss in chunks, and with how many tokens each.
//
// With a large vocabulary the head's fp32 logits and their gradient are the largest tensors of
// a step (2 x 512 tokens of Qwen3's 151,936-token vocabulary: 622 MB each). The chunked loss
// (CausalLM::set_loss_chunk_tokens) never holds them whole; with a plain head at no extra GEMM
// (models/linear_cross_entropy.h), with a tensor-parallel one at one more head GEMM per chunk.
// `chunked_loss.enabled: auto` (the default) turns it on where it buys memory that matters: a
// micro-batch's fp32 logits would take kAutoMinLogitsBytes or more and span at least two chunks. It stays off where the chunked
// loss cannot run (sequence_parallel with loss_parallel; the zero_bubble pipeline schedule);
// asked for there, the config checks refuse it. `chunked_loss.chunk_size: auto` keeps one
// chunk's fp32 logits near kAutoChunkLogitsBytes (its tokens rounded up to kAutoChunkMultiple).
#pragma once

#include <cstdint>
#include <string>

#include "hyperparallel/models/model_config.h"
#include "hyperparallel/train/train_config.h"

namespace hyperparallel::train {

constexpr int64_t kAutoMinLogitsBytes = int64_t{256} << 20;
// 128 MiB, rounded up to a multiple of 128 tokens (256 tokens for a 151,936-token vocabulary).
// On the 103 M Qwen3 of docs/benchmarks.md "Real data" (one process, 10 steps): chunks of
// 441 / 256 tokens peaked at 2828 / 2745 MiB once the step's peak had moved into the forward
// (the attention no longer keeps its probabilities; the forward's live activations meet one
// chunk's logits there). Earlier, with the peak at the end of backward, 512 / 256 / 128
// tokens stepped in 12.39 / 12.69 / 14.39 s: below 256 tokens the head's GEMMs lose speed.
constexpr int64_t kAutoChunkLogitsBytes = int64_t{128} << 20;
constexpr int64_t kAutoChunkMultiple = 128;

struct LossChunking {
  int64_t chunk_tokens = 0;  // 0: the whole micro-batch's logits at once
  std::string reason;        // what decided it
  bool announce = false;     // the banner says it: on, or auto kept off by the layout
};

// `cp_size`: the context-parallel degree (each rank holds 1/cp of a row's tokens).
LossChunking resolve_loss_chunking(const TrainConfig& c, const models::ModelConfig& model, int64_t cp_size);

}  // namespace hyperparallel::train
