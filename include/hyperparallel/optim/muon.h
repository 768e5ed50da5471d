// Muon (MomentUm Orthogonalized by Newton–Schulz) for a model's matrices, AdamW for the rest,
// exact under any sharding.
//
// Per matrix W with gradient G (torch.optim.Muon's arithmetic, in fp32):
//   B <- B.lerp(G, 1 - momentum)                       the momentum buffer
//   U <- nesterov ? G.lerp(B, momentum) : B
//   O <- NewtonSchulz(U, ns_steps)                      quintic, coefficients (3.4445, -4.7750, 2.0315)
//   W <- W (1 - lr · weight_decay) - lr · scale · O     scale: adjust_lr (below)
// with adjust_lr "match_rms_adamw" (Moonlight's, the default: scale 0.2·sqrt(max(rows, cols)),
// so updates have AdamW's RMS and one learning-rate schedule serves both) or "original"
// (Keller Jordan's: sqrt(max(1, rows / cols))). Muon takes the 2-D weights except the token
// embedding and the head (takes_muon); embeddings, the head, norms and biases go to AdamW.
//
// Newton–Schulz needs whole matrices, and under FSDP and TP each rank holds a box of each.
// Each matrix has an owner rank (round-robin over the world in the model's parameter order);
// one all-to-all sends every rank's U boxes to their owners (one holder of each distinct box
// sends: HSDP replicas do not repeat it), each owner assembles its matrices whole and
// orthogonalises them, and a second all-to-all returns every holder its box of O. The whole
// U equals the one-process U element for element, so the update equals a one-process Muon's
// up to the gradients' own rounding (tested against one process at FSDP4 and FSDP2 x TP2).
//
// It is a torch::optim::AdamW (FusedAdamW for the AdamW groups): the Muon matrices form the
// last param group, whose lr and weight_decay are Muon's, and each matrix's momentum buffer
// is its AdamWParamState::exp_avg (exp_avg_sq stays an unused zero), so schedules that scale
// each group's lr, checkpoints of AdamW state and offload_state() (the buffers streamed
// through the file like AdamW's moments) work unchanged.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/optim/fused_adamw.h"

namespace torch::nn {
class Module;
}

namespace hyperparallel::optim {

struct MuonOptions {
  double lr = 0.02;
  double momentum = 0.95;
  bool nesterov = true;
  int64_t ns_steps = 5;
  double weight_decay = 0.1;
  std::string adjust_lr = "match_rms_adamw";  // or "original"
};

// The orthogonalised U (same shape), in fp32: U / (|U|_F + 1e-7), transposed when taller than
// wide, `steps` quintic iterations X <- aX + (bA + cA²)X with A = XXᵀ.
at::Tensor newton_schulz(const at::Tensor& u, int64_t steps);

// Whether Muon updates the parameter `name` of (whole) shape `shape`.
bool takes_muon(const std::string& name, const std::vector<int64_t>& shape);

class Muon : public FusedAdamW {
 public:
  // `adamw_groups`: the parameters Muon does not take. Muon's matrices are every parameter of
  // `root` that takes_muon() accepts, each rank holding its box (fsdp::sharded_state_dict).
  // `world`: every rank holding a piece of some matrix (null: one process, whole matrices).
  // UserError for invalid options.
  Muon(std::vector<torch::optim::OptimizerParamGroup> adamw_groups, const torch::optim::AdamWOptions& adamw,
       torch::nn::Module& root, const MuonOptions& muon, std::shared_ptr<comm::Communicator> world);
  ~Muon() override;
  at::Tensor step(LossClosure closure = nullptr) override;
  size_t muon_group() const { return param_groups().size() - 1; }
  size_t matrix_count() const;  // matrices of the whole model (held here or not)

  struct Layout;  // who holds which box of which matrix (src/optim/muon.cpp)

 private:
  std::unique_ptr<Layout> layout_;
  MuonOptions options_;
  std::shared_ptr<comm::Communicator> world_;

  std::vector<at::Tensor> orthogonalised(const std::vector<at::Tensor>& updates);
};

}  // namespace hyperparallel::optim
