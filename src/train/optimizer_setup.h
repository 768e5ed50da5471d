// The trainer's optimizer from its config: FusedAdamW with HF's parameter groups (no weight
// decay on biases and norm weights), or (optim: muon) Muon for the matrices with those AdamW
// groups for the rest (optim/muon.h), and the Muon options the config's muon_config gives.
#pragma once

#include <memory>

#include "hyperparallel/comm/communicator.h"
#include "hyperparallel/optim/muon.h"
#include "hyperparallel/train/train_config.h"

namespace hyperparallel::models {
class CausalLM;
}

namespace hyperparallel::train {

// muon_config with its unset lr and weight_decay following learning_rate and weight_decay.
optim::MuonOptions muon_options(const TrainConfig& c);

// `world`: the ranks holding pieces of the matrices (Muon's owners are drawn from it).
std::unique_ptr<optim::FusedAdamW> make_optimizer(const TrainConfig& c, models::CausalLM& model,
                                                  const std::shared_ptr<comm::Communicator>& world);

}  // namespace hyperparallel::train
