// Loss parallelism: next-token cross-entropy on vocab-sharded logits, never gathering them.
//
// Each tp rank holds logits z_r for its vocab rows (the ceil split of the vocabulary, as the
// column-parallel head and the vocab-parallel embedding split it). Per token: the max over
// ranks (all-reduce MAX, no gradient: a constant shift), the sum of exp(z - max) over ranks
// (all-reduce SUM), and the label's logit from the rank that holds it (all-reduce SUM); loss =
// log(sum) + max - label logit. The sums' backward is the identity, so each rank's gradient
// is softmax(z)_r - onehot_r on its own rows. Three all-reduces of [tokens] floats instead of
// an all-gather of [tokens, vocab]. Decoding (no labels) all-gathers the logits.
#pragma once

#include <memory>

#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/causal_lm.h"

namespace hyperparallel::tp {

std::shared_ptr<models::TokenLoss> vocab_parallel_cross_entropy(std::shared_ptr<comm::Communicator> tp_group,
                                                                int64_t vocab_size);

// Installs it on `model`; the model's head must be vocab-parallel (plan_for with loss_parallel).
void enable_loss_parallel(models::CausalLM& model, const mesh::DeviceMesh& tp_mesh);

}  // namespace hyperparallel::tp
