#include "hyperparallel/tp/model_plans.h"

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::tp {
namespace {

using dtensor::Replicate;
using dtensor::Shard;

// The tp degrees up to `limit` that the attention heads allow.
std::string valid_degrees(const models::ModelConfig& c, int64_t limit) {
  std::string out;
  for (int64_t t = 1; t <= limit; ++t) {
    const bool heads = c.num_attention_heads % t == 0;
    const bool kv = c.num_key_value_heads % t == 0 || t % c.num_key_value_heads == 0;
    if (heads && kv) out += (out.empty() ? "" : ", ") + std::to_string(t);
  }
  return out;
}

void check_fits(const models::ModelConfig& c, int64_t tp) {
  if (tp < 1) throw UserError("tp_size " + std::to_string(tp) + " must be >= 1");
  const bool heads = c.num_attention_heads % tp == 0;
  const bool kv = c.num_key_value_heads % tp == 0 || tp % c.num_key_value_heads == 0;
  if (!heads || !kv) {
    throw UserError("tp_size " + std::to_string(tp) + " does not fit " + c.model_type + ": num_attention_heads (" +
                    std::to_string(c.num_attention_heads) + ") must divide by it and num_key_value_heads (" +
                    std::to_string(c.num_key_value_heads) + ") must divide by it or divide it; valid tp sizes: " +
                    valid_degrees(c, std::max<int64_t>(tp, 2 * c.num_attention_heads)));
  }
}

}  // namespace

ParallelizePlan plan_for(const models::ModelConfig& c, int64_t tp, const TensorParallelOptions& options) {
  check_fits(c, tp);
  const bool sp = options.sequence_parallel;
  const auto block_output = sp ? Shard(1) : Replicate();
  const bool lp = options.loss_parallel;
  ParallelizePlan plan;
  if (c.tie_word_embeddings && !lp) {
    NoParallel whole;
    whole.output_layout = block_output;
    plan.add("model.embed_tokens", whole);
  } else {
    RowwiseParallel vocab;
    vocab.input_layout = Replicate();
    vocab.output_layout = block_output;
    plan.add("model.embed_tokens", vocab);
  }
  PrepareModuleInput block_input;
  block_input.input_layout = sp ? Shard(1) : Replicate();
  ColwiseParallel colwise;
  colwise.reduce_input_grad = false;  // the block's PrepareModuleInput sums it once
  RowwiseParallel rowwise;
  rowwise.output_layout = block_output;
  plan.add("model.layers.*.self_attn", block_input);
  plan.add("model.layers.*.self_attn.q_proj", colwise);
  if (c.num_key_value_heads % tp == 0) {
    plan.add("model.layers.*.self_attn.k_proj", colwise);
    plan.add("model.layers.*.self_attn.v_proj", colwise);
  } else {
    ReplicatedKvHeads kv;
    kv.num_heads = c.num_attention_heads;
    kv.num_kv_heads = c.num_key_value_heads;
    kv.head_dim = c.head_dim;
    plan.add("model.layers.*.self_attn.k_proj", kv);
    plan.add("model.layers.*.self_attn.v_proj", kv);
  }
  plan.add("model.layers.*.self_attn.o_proj", rowwise);
  if (c.qk_norm) {
    SequenceParallel head_norm;
    head_norm.sequence_dim = 2;  // [batch, seq, local heads, head_dim]
    head_norm.input_layout = head_norm.output_layout = Shard(2);
    plan.add("model.layers.*.self_attn.q_norm", head_norm);
    plan.add("model.layers.*.self_attn.k_norm", head_norm);
  }
  // Dense MLPs split over tp; a sparse (MoE) block runs whole on every tp rank until expert
  // parallelism splits its experts: under SP it gathers its input and slices its output.
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string mlp = "model.layers." + std::to_string(i) + ".mlp";
    if (c.is_moe_layer(i)) {
      if (!sp) continue;
      NoParallel whole_block;
      whole_block.input_layout = whole_block.output_layout = Shard(1);
      plan.add(mlp, whole_block);
      continue;
    }
    plan.add(mlp, block_input);
    plan.add(mlp + ".gate_proj", colwise);
    plan.add(mlp + ".up_proj", colwise);
    plan.add(mlp + ".down_proj", rowwise);
  }
  if (lp) {
    // The final norm's output feeds the sharded head: gathered (SP) or kept, its gradient
    // summed over tp. Added before the norm's SequenceParallel so it wraps it.
    PrepareModuleOutput head_input;
    head_input.output_layout = sp ? Shard(1) : Replicate();
    plan.add("model.norm", head_input);
    if (!c.tie_word_embeddings) {
      ColwiseParallel head = colwise;  // output: this rank's vocab rows
      plan.add("lm_head", head);
    }
  }
  if (sp) {
    plan.add("model.layers.*.input_layernorm", SequenceParallel{});
    plan.add("model.layers.*.post_attention_layernorm", SequenceParallel{});
    SequenceParallel final_norm;
    final_norm.output_layout = lp ? Shard(1) : Replicate();  // a replicated head reads the whole sequence
    plan.add("model.norm", final_norm);
  }
  return plan;
}

}  // namespace hyperparallel::tp
