// Decoding with a KV cache: cached logits equal a full forward's, batched left-padded
// generation equals each prompt alone, and the options (stop ids, sampling, errors) behave.
#include <gtest/gtest.h>

#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/models/generation.h"
#include "hyperparallel/platform/user_error.h"

namespace hp = hyperparallel;
using hp::models::AutoModelForCausalLM;
using hp::models::CausalLMInput;
using hp::models::GenerationOptions;
using hp::models::KVCache;
using hp::models::ModelLoadOptions;

namespace {

std::vector<std::vector<int64_t>> prompts_for(int64_t vocab) {
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t length : {7, 3, 12}) {
    std::vector<int64_t> p;
    for (int64_t i = 0; i < length; ++i) p.push_back((37 * i + 11 * length + 5) % vocab);
    prompts.push_back(p);
  }
  return prompts;
}

std::shared_ptr<hp::models::CausalLM> model_of(const std::string& flavour, bool fused) {
  ModelLoadOptions options;
  options.seed = 3;
  if (fused) options.plan_overrides = {{"*.self_attn", "Qwen3Attention", "fused_qkv_attention"}};
  return AutoModelForCausalLM::from_pretrained(flavour, options);
}

}  // namespace

TEST(Generation, CachedStepsGiveTheFullForwardLogits) {
  // Llama has grouped KV heads, Qwen3 q/k norms; the fused attention shares the cache code.
  for (const auto& [flavour, fused] : std::vector<std::pair<std::string, bool>>{
           {"llama-debug", false}, {"qwen3-debug", false}, {"qwen3-debug", true}}) {
    SCOPED_TRACE(flavour + (fused ? " fused" : ""));
    auto model = model_of(flavour, fused);
    at::NoGradGuard no_grad;
    const at::Tensor ids = at::randint(model->config().vocab_size, {2, 10}, at::kLong);
    CausalLMInput full;
    full.input_ids = ids;
    const at::Tensor expected = model->forward(full).logits;

    KVCache cache;
    std::vector<at::Tensor> pieces;
    for (auto [begin, length] : std::vector<std::pair<int64_t, int64_t>>{{0, 6}, {6, 1}, {7, 3}}) {
      CausalLMInput step;
      step.input_ids = ids.narrow(1, begin, length);
      step.cache = &cache;
      pieces.push_back(model->forward(step).logits);
      EXPECT_EQ(cache.length(), begin + length);
    }
    const at::Tensor got = at::cat(pieces, 1);
    EXPECT_TRUE(at::allclose(got, expected, 1e-5, 1e-5)) << (got - expected).abs().max().item<double>();
  }
}

TEST(Generation, BatchedLeftPaddedEqualsEachPromptAloneAndTheUncachedPath) {
  for (const std::string flavour : {"llama-debug", "qwen3-debug"}) {
    SCOPED_TRACE(flavour);
    auto model = model_of(flavour, false);
    const auto prompts = prompts_for(model->config().vocab_size);
    GenerationOptions options;
    options.max_new_tokens = 8;
    const auto batched = hp::models::generate(*model, prompts, options);
    options.use_cache = false;
    EXPECT_EQ(hp::models::generate(*model, prompts, options), batched);
    options.use_cache = true;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto alone = hp::models::generate(*model, {prompts[i]}, options);
      EXPECT_EQ(alone[0], batched[i]) << "prompt " << i;
      EXPECT_EQ(batched[i].size(), 8u);
    }
  }
}

TEST(Generation, StopsAtAStopIdAndSamplesReproducibly) {
  auto model = model_of("qwen3-debug", false);
  const auto prompts = prompts_for(model->config().vocab_size);
  GenerationOptions options;
  options.max_new_tokens = 6;
  const auto free = hp::models::generate(*model, prompts, options);
  // Stop at the third token the first row produces: that row ends before it.
  options.stop_ids = {free[0][2]};
  const auto stopped = hp::models::generate(*model, prompts, options);
  const auto first = std::find(free[0].begin(), free[0].end(), free[0][2]);
  EXPECT_EQ(stopped[0], std::vector<int64_t>(free[0].begin(), first));

  GenerationOptions sampled;
  sampled.max_new_tokens = 6;
  sampled.temperature = 1.0;
  sampled.seed = 7;
  const auto a = hp::models::generate(*model, prompts, sampled);
  EXPECT_EQ(hp::models::generate(*model, prompts, sampled), a);
  sampled.seed = 8;
  EXPECT_NE(hp::models::generate(*model, prompts, sampled), a);
}

TEST(Generation, BadArgumentsAreUserErrors) {
  auto model = model_of("qwen3-debug", false);
  GenerationOptions options;
  options.max_new_tokens = 0;
  EXPECT_THROW(hp::models::generate(*model, {{1, 2}}, options), hp::UserError);
  options.max_new_tokens = 2;
  EXPECT_THROW(hp::models::generate(*model, {{}}, options), hp::UserError);
  KVCache cache;
  CausalLMInput in;
  in.input_ids = at::ones({1, 3}, at::kLong);
  in.cache = &cache;
  model->forward(in);
  in.attention_mask = at::ones({1, 3}, at::kLong);  // must cover the 3 cached tokens too
  EXPECT_THROW(model->forward(in), hp::UserError);
}

// The model's context bounds the prompt and the tokens after it: a prompt as long as the
// context, or a request for 2^31 - 1 new tokens, is refused up front (not an OOM later).
TEST(Generation, ThePromptAndNewTokensMustFitTheContext) {
  auto model = model_of("qwen3-debug", false);
  const int64_t context = model->config().max_position_embeddings;
  const auto error_of = [&](size_t prompt_tokens, int64_t new_tokens) {
    GenerationOptions options;
    options.max_new_tokens = new_tokens;
    try {
      hp::models::generate(*model, {std::vector<int64_t>(prompt_tokens, 3)}, options);
    } catch (const hp::UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of(static_cast<size_t>(context), 1).find("the prompt has " + std::to_string(context) + " tokens; the model's context is"),
            std::string::npos);
  const std::string e = error_of(10, 2147483647);
  EXPECT_NE(e.find("use at most " + std::to_string(context - 10) + " new tokens"), std::string::npos) << e;
  EXPECT_EQ(error_of(10, 2), "");
}
