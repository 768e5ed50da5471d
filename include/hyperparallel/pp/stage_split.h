// Which decoder layers each pipeline stage runs, and cutting a model down to one rank's stages.
//
// A split lists, per stage 0..S-1 in model order, a ModelSpan: stage 0 also holds the embedding,
// stage S-1 the final norm and head (and the loss). The balanced default counts the embedding
// and the head as one layer each and gives the S stages equal shares of the L + 2 pieces, the
// remainder going to middle stages first (8 layers over 4 stages: 1, 3, 3, 1 layers). An
// explicit split is a list of inclusive ranges ("0-7", "8-15", or "5" for one layer) that
// covers every layer once, in order. With virtual stages a rank holds several stages (rank r
// holds r, r + ranks, ...; pp/schedule.h); keep_stages drops everything else from the model, so
// each rank holds, loads, shards, optimizes and checkpoints only its own parameters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hyperparallel/models/causal_lm.h"
#include "hyperparallel/pp/schedule.h"

namespace hyperparallel::pp {

// UserError when there are more stages than pieces (layers + 2) or fewer than 1.
std::vector<models::ModelSpan> balanced_split(int64_t layers, int64_t stages);
// UserError naming the range that is malformed, overlaps, leaves a gap or does not fit, or a
// count of ranges other than `stages`.
std::vector<models::ModelSpan> explicit_split(const std::vector<std::string>& ranges, int64_t layers, int64_t stages);
// "0-3, 4-7": the split as an explicit list would write it.
std::string to_string(const std::vector<models::ModelSpan>& split);

// A decoder layer's forward, input-gradient and weight-gradient costs relative to its forward,
// for zero_bubble's list (make_schedule), from its matmul FLOPs per token at
// `sequence_length`: the weight GEMMs G (attention projections and the MLP; for MoE the
// routed experts' share and the router) run once in each of F, I and W, the attention core A
// (scores and weighted sum) once in F and twice in I: F = G + A, I = G + 2A, W = G.
ActionCosts layer_costs(const models::ModelConfig& config, int64_t sequence_length);

// The stages rank `rank` of `ranks` holds with `virtual_stages` each, in model order.
std::vector<int64_t> stages_of_rank(int64_t rank, int64_t ranks, int64_t virtual_stages);

// Keeps in `model` only what the stages of rank `rank` hold (CausalLM::keep_only).
void keep_stages(models::CausalLM& model, const std::vector<models::ModelSpan>& split, int64_t rank, int64_t ranks);

}  // namespace hyperparallel::pp
