#include "hyperparallel/tp/loss_parallel.h"

#include <ATen/ATen.h>

#include "hyperparallel/dtensor/functional_collectives.h"
#include "hyperparallel/dtensor/placement.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::tp {
namespace {

class VocabParallelCrossEntropy : public models::TokenLoss {
 public:
  VocabParallelCrossEntropy(std::shared_ptr<comm::Communicator> group, int64_t vocab)
      : group_(std::move(group)), vocab_(vocab),
        first_(dtensor::shard_offset(vocab, group_->size(), group_->rank())),
        rows_(dtensor::shard_length(vocab, group_->size(), group_->rank())) {}
  bool takes_vocab_shards() const override { return true; }

  at::Tensor sum(const at::Tensor& logits, const at::Tensor& labels) override {
    if (logits.size(-1) != rows_) {
      throw UserError("loss parallel: the head gives " + std::to_string(logits.size(-1)) + " logits per token, this rank's vocab "
                      "shard is " + std::to_string(rows_) + " of " + std::to_string(vocab_) +
                      "; the head must be column-parallel (tp::plan_for with loss_parallel)");
    }
    const at::Tensor z = logits.to(at::kFloat);
    // Empty shards (vocab < tp) contribute nothing: -inf max, zero sums.
    at::Tensor max = rows_ > 0 ? std::get<0>(z.detach().max(-1)).contiguous()
                               : at::full({z.size(0)}, -std::numeric_limits<float>::infinity(), z.options());
    group_->all_reduce(max, comm::ReduceOp::kMax).wait();
    const at::Tensor sum_exp = dtensor::all_reduce((z - max.unsqueeze(-1)).exp().sum(-1), *group_);
    const at::Tensor mine = labels.ge(first_).logical_and(labels.lt(first_ + rows_));
    const at::Tensor local = at::where(mine, labels - first_, at::zeros_like(labels));
    // An empty shard's zeros stay in the graph (z.sum over no rows), as its peers' terms do.
    at::Tensor picked = rows_ > 0 ? z.gather(-1, local.unsqueeze(-1)).squeeze(-1) * mine : z.sum(-1);
    const at::Tensor label_logit = dtensor::all_reduce(picked, *group_);
    const at::Tensor per_token = sum_exp.log() + max - label_logit;
    return (per_token * labels.ne(-100)).sum();
  }

  at::Tensor full_logits(const at::Tensor& logits) override {
    return dtensor::all_gather_into(logits, logits.dim() - 1, *group_, {vocab_, dtensor::GradIs::kReplicate});
  }

 private:
  std::shared_ptr<comm::Communicator> group_;
  int64_t vocab_, first_, rows_;
};

}  // namespace

std::shared_ptr<models::TokenLoss> vocab_parallel_cross_entropy(std::shared_ptr<comm::Communicator> tp_group,
                                                                int64_t vocab_size) {
  return std::make_shared<VocabParallelCrossEntropy>(std::move(tp_group), vocab_size);
}

void enable_loss_parallel(models::CausalLM& model, const mesh::DeviceMesh& tp_mesh) {
  model.set_token_loss(vocab_parallel_cross_entropy(tp_mesh.comm(tp_mesh.axis_names().at(0)), model.config().vocab_size));
}

}  // namespace hyperparallel::tp
