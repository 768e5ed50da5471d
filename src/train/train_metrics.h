// The numbers the trainer logs about its own speed: FLOPs per token, the machine's matmul
// roofline measured at the start of the run, model FLOPs utilisation, and Python's
// timedelta text for LlamaFactory's elapsed/remaining fields.
//
// FLOPs per token count the matmuls of a forward and backward (3 x 2 FLOPs per weight a token
// meets: the attention projections, the dense MLP or the router and top-k experts, the head)
// plus attention's scores and weighted sum (12 x layers x q width x mean sequence length) —
// the PaLM accounting, with MoE counting only the experts a token is routed to. Norms,
// activations and the embedding lookup are not counted. MFU = FLOPs per token x tokens per
// second / the sum over ranks of each rank's best fp32 GEMM rate at the model's shapes,
// measured by every rank at once, so the cores the ranks share are shared in the roofline
// too. It says how close the run is to doing nothing but matmuls; a bf16 run compares with the
// fp32 roofline, so it can exceed what fp32 could.
#pragma once

#include <cstdint>
#include <string>

#include "hyperparallel/models/model_config.h"

namespace hyperparallel::train {

double training_flops_per_token(const models::ModelConfig& config, double mean_sequence_length);

// Best GFLOP/s of this process for C = A B at the model's GEMM shapes (a few ms for a small
// model, ~0.3 s at hidden 1024).
double measure_matmul_gflops(const models::ModelConfig& config);

// "H:MM:SS" as Python's str(datetime.timedelta(seconds=int(s))) writes it ("1 day, 2:03:04").
std::string timedelta_text(double seconds);

}  // namespace hyperparallel::train
