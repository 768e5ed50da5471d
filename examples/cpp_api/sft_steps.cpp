// hyperparallel as a C++ library: FSDP fine-tuning of a Hugging Face-shaped model in ~80 lines.
//
//   build/hyperparallel run --nproc-per-node 2 -- build/cpp_api_sft_steps examples/tokenizer
//
// Every rank: join the process group from the launcher's environment, build a 1-D device mesh,
// build the model (here the built-in qwen3-debug; from_pretrained("/path/to/folder") loads a
// Hugging Face folder), fully_shard each decoder layer and then the root, and train with a
// plain torch::optim::AdamW — it sees only this rank's shards. The data is the built-in
// synthetic_reverse set rendered by the qwen3 chat template; each step takes a global batch of
// 8 rows, this rank its slice, and divides the summed token loss by the global label count so
// the gradient (summed over ranks) is the one a single process would compute. Rank 0 prints
// the loss and, at the end, a greedy answer (the unit all-gathers run on every rank).
#include <torch/optim/adamw.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/data/batch_sampler.h"
#include "hyperparallel/data/chat_template.h"
#include "hyperparallel/data/sft_samples.h"
#include "hyperparallel/data/synthetic_sft.h"
#include "hyperparallel/data/tokenizer.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/models/causal_lm.h"
#include "hyperparallel/models/generation.h"

namespace hp = hyperparallel;

int main(int argc, char** argv) {
  const std::string tokenizer_dir = argc > 1 ? argv[1] : "examples/tokenizer";
  auto world = hp::comm::init_process_group(hp::comm::rendezvous_info_from_env());
  const auto mesh = hp::mesh::init_device_mesh(world, "cpu", {world->size()}, {"dp_shard"});

  auto model = hp::models::AutoModelForCausalLM::from_pretrained("qwen3-debug");
  hp::fsdp::FullyShardOptions options;
  options.mesh = mesh;
  for (auto* layer : model->decoder_layers()) hp::fsdp::fully_shard(*layer, options);
  hp::fsdp::FSDPModule root = hp::fsdp::fully_shard(*model, options);
  root.set_reduce_op_type("sum");  // each rank's loss is already divided by the global count
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3));

  const auto tokenizer = hp::data::Tokenizer::from_file(tokenizer_dir);
  const auto chat = hp::data::ChatTemplate::named("qwen3");
  const auto rows = hp::data::build_sft_rows(tokenizer, chat, hp::data::make_synthetic_dataset("synthetic_reverse", 256).train, {});
  const hp::data::GlobalBatchSampler sampler(static_cast<int64_t>(rows.size()), 8, /*seed=*/0);
  const int64_t pad = tokenizer.token_to_id("<|endoftext|>").value_or(0);

  hp::data::SamplerPosition position;
  for (int step = 0; step < 10; ++step, position = sampler.next(position)) {
    const auto global = sampler.global_batch_rows(position);
    int64_t label_tokens = 0;
    for (int64_t r : global) label_tokens += hp::data::label_tokens(rows[r]);
    std::vector<const hp::data::TrainingRow*> mine;
    for (int64_t r : hp::data::GlobalBatchSampler::rank_micro_batch(global, mesh.rank(), mesh.size(), 0, 1)) mine.push_back(&rows[r]);
    const auto batch = hp::data::collate_rows(mine, pad);
    const auto as_tensor = [&](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).view({batch.rows, batch.length}); };
    hp::models::CausalLMInput in;
    in.input_ids = as_tensor(batch.input_ids);
    in.labels = as_tensor(batch.labels);
    in.attention_mask = as_tensor(batch.attention_mask);
    const auto out = model->forward(in);
    (out.lm_loss_sum / static_cast<double>(label_tokens)).backward();
    optimizer.step();
    optimizer.zero_grad();
    at::Tensor loss = out.lm_loss_sum.detach().reshape({1});
    world->all_reduce(loss).wait();
    if (world->rank() == 0) std::cout << "step " << step + 1 << " loss " << loss.item<double>() / label_tokens << std::endl;
  }

  hp::data::ChatRenderOptions prompt_options;
  prompt_options.add_generation_prompt = true;
  prompt_options.enable_thinking = false;
  const auto prompt = tokenizer.encode(chat.render({{"user", "Reverse the words: sun tree river"}}, prompt_options));
  hp::models::GenerationOptions generation;
  generation.max_new_tokens = 8;
  generation.stop_ids = tokenizer.end_of_turn_ids();
  generation.run_all_steps = true;  // the same number of forwards on every rank
  const auto answer = hp::models::generate(*model, {prompt}, generation);
  if (world->rank() == 0) {
    // As a JSON string: a model this young often answers with newlines.
    std::cout << "answer after 10 steps: " << nlohmann::json(tokenizer.decode(answer[0], true)).dump() << std::endl;
  }
  return 0;
}
