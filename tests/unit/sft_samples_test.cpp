// Conversations -> labelled token rows with the real tokenizers; packing checked through a
// model (a packed row's loss is the sum of its samples' losses); batches.
#include <gtest/gtest.h>

#include "hyperparallel/data/sft_samples.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/platform/user_error.h"
#include "support/test_files.h"

namespace hp = hyperparallel;
using hp::data::ChatMessage;
using hp::data::ChatTemplate;
using hp::data::kIgnoreLabel;
using hp::data::SampleOptions;
using hp::data::Tokenizer;
using hp::data::TrainingRow;

namespace {

const std::string kFixtures = HP_SOURCE_DIR "/tests/fixtures/tokenizer";
const std::vector<ChatMessage> kConversation = {
    {"system", "You are helpful."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}, {"assistant", "4"}};

}  // namespace

TEST(SftSamples, LabelsCoverExactlyTheResponsesAsTheTemplateRendersThem) {
  const auto tokenizer = Tokenizer::from_file(kFixtures + "/qwen3");
  const auto qwen3 = ChatTemplate::named("qwen3");
  const TrainingRow row = hp::data::tokenize_conversation(tokenizer, qwen3, kConversation, {});
  EXPECT_EQ(row.input_ids, tokenizer.encode(qwen3.render(kConversation)));
  // The historical turn has no think block; the last one has the empty one, as rendered.
  EXPECT_EQ(hp::testing::labelled_runs(tokenizer, row), (std::vector<std::string>{"Hello!<|im_end|>", "<think>\n\n</think>\n\n4<|im_end|>"}));
  for (size_t i = 0; i < row.position_ids.size(); ++i) EXPECT_EQ(row.position_ids[i], static_cast<int64_t>(i));

  const auto llama_tokenizer = Tokenizer::from_file(kFixtures + "/llama3");
  const TrainingRow llama = hp::data::tokenize_conversation(llama_tokenizer, ChatTemplate::named("llama3"), kConversation, {});
  EXPECT_EQ(hp::testing::labelled_runs(llama_tokenizer, llama), (std::vector<std::string>{"Hello!<|eot_id|>", "4<|eot_id|>"}));

  const auto eos = tokenizer.special_tokens().eos;
  EXPECT_EQ(eos, "<|im_end|>");
  const TrainingRow plain = hp::data::tokenize_conversation(tokenizer, ChatTemplate::named("default", eos), kConversation, {});
  EXPECT_EQ(hp::testing::labelled_runs(tokenizer, plain), (std::vector<std::string>{"Hello!<|im_end|>", "4<|im_end|>"}));
}

TEST(SftSamples, SentencePieceBoundariesFollowTheFullEncoding) {
  // Llama 2's " [/INST] Hello" has no pre-tokenizer split: the response's first token carries
  // the space. The ids stay those of the whole text; the straddling token counts as response.
  const auto tokenizer = Tokenizer::from_file(kFixtures + "/mistral");
  const auto llama2 = ChatTemplate::named("llama2");
  const TrainingRow row = hp::data::tokenize_conversation(tokenizer, llama2, kConversation, {});
  EXPECT_EQ(row.input_ids, tokenizer.encode(llama2.render(kConversation)));
  const auto runs = hp::testing::labelled_runs(tokenizer, row);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_NE(runs[0].find("Hello! </s>"), std::string::npos) << runs[0];
  EXPECT_EQ(runs[0].find("INST"), std::string::npos) << runs[0];
  EXPECT_NE(runs[1].find("4 </s>"), std::string::npos) << runs[1];
}

TEST(SftSamples, TrainOnPromptLabelsEveryTokenButTheFirst) {
  const auto tokenizer = Tokenizer::from_file(kFixtures + "/qwen3");
  SampleOptions options;
  options.train_on_prompt = true;
  const TrainingRow row = hp::data::tokenize_conversation(tokenizer, ChatTemplate::named("qwen"), kConversation, options);
  ASSERT_GT(row.labels.size(), 10u);
  EXPECT_EQ(row.labels[0], kIgnoreLabel);
  EXPECT_TRUE(std::equal(row.labels.begin() + 1, row.labels.end(), row.input_ids.begin() + 1));
}

TEST(SftSamples, MaskHistoryLabelsTheLastResponseOnly) {
  const auto tokenizer = Tokenizer::from_file(kFixtures + "/qwen3");
  const auto qwen = ChatTemplate::named("qwen3_nothink");
  const std::vector<hp::data::ChatMessage> chat = {{"user", "Hi"}, {"assistant", "Hello there"}, {"user", "2+2?"}, {"assistant", "4"}};
  SampleOptions options;
  const TrainingRow all = hp::data::tokenize_conversation(tokenizer, qwen, chat, options);
  options.mask_history = true;
  const TrainingRow last = hp::data::tokenize_conversation(tokenizer, qwen, chat, options);
  ASSERT_EQ(all.input_ids, last.input_ids);
  const auto labelled = [&](const TrainingRow& row) {
    std::vector<int64_t> ids;
    for (int64_t l : row.labels) {
      if (l != kIgnoreLabel) ids.push_back(l);
    }
    return tokenizer.decode(ids);
  };
  EXPECT_EQ(labelled(all), "Hello there<|im_end|>4<|im_end|>");
  EXPECT_EQ(labelled(last), "4<|im_end|>");
}

TEST(SftSamples, CutoffTruncatesAndDropsSamplesWithoutResponseTokens) {
  const auto tokenizer = Tokenizer::from_file(kFixtures + "/qwen3");
  const auto qwen = ChatTemplate::named("qwen");
  hp::data::Conversation short_one{{{"user", "Hi"}, {"assistant", "Hello there, friend."}}, "a.jsonl:1"};
  hp::data::Conversation long_prompt{{{"user", std::string(400, 'x')}, {"assistant", "ok"}}, "a.jsonl:2"};
  const int64_t full = static_cast<int64_t>(hp::data::tokenize_conversation(tokenizer, qwen, short_one.messages, {}).input_ids.size());
  SampleOptions options;
  options.cutoff_len = full - 2;  // cuts into the first sample's response
  hp::data::SampleReport report;
  const auto rows = hp::data::build_sft_rows(tokenizer, qwen, {short_one, long_prompt}, options, &report);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(static_cast<int64_t>(rows[0].input_ids.size()), full - 2);
  EXPECT_EQ(report.truncated, 2);
  ASSERT_EQ(report.dropped.size(), 1u);
  EXPECT_NE(report.dropped[0].find("a.jsonl:2: no response tokens within cutoff_len"), std::string::npos);
  options.cutoff_len = 1;
  EXPECT_THROW(hp::data::build_sft_rows(tokenizer, qwen, {short_one}, options), hp::UserError);
}

TEST(SftSamples, PackedRowsLoseExactlyWhatTheSamplesLoseAlone) {
  // Rows of ids < 512 (the debug model's vocabulary), prompt tokens unlabelled.
  std::vector<TrainingRow> rows;
  for (int64_t len : {7, 12, 5, 9, 14}) {
    TrainingRow r;
    for (int64_t i = 0; i < len; ++i) {
      r.input_ids.push_back((len * 37 + i * 11) % 512);
      r.labels.push_back(i == 0 || i < len / 3 ? kIgnoreLabel : r.input_ids.back());
      r.position_ids.push_back(i);
    }
    rows.push_back(r);
  }
  const auto packed = hp::data::pack_rows(rows, 20);
  ASSERT_EQ(packed.size(), 3u);  // 7+12 | 5+9 | 14
  EXPECT_EQ(packed[0].position_ids[7], 0);
  EXPECT_EQ(packed[0].position_ids[8], 1);
  EXPECT_EQ(packed[0].input_ids.size(), 19u);
  EXPECT_THROW(hp::data::pack_rows(rows, 10), hp::UserError);

  auto model = hp::models::AutoModelForCausalLM::from_pretrained("qwen3-debug");
  const auto loss_of = [&](const std::vector<TrainingRow>& batch_rows, int64_t* tokens) {
    std::vector<const TrainingRow*> ptrs;
    for (const auto& r : batch_rows) ptrs.push_back(&r);
    const auto batch = hp::data::collate_rows(ptrs, 0);
    const auto tensor = [&](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).view({batch.rows, batch.length}); };
    hp::models::CausalLMInput in;
    in.input_ids = tensor(batch.input_ids);
    in.labels = tensor(batch.labels);
    in.attention_mask = tensor(batch.attention_mask);
    in.position_ids = tensor(batch.position_ids);
    const auto out = model->forward(in);
    EXPECT_EQ(out.label_tokens, batch.label_tokens());
    *tokens = out.label_tokens;
    return out.lm_loss_sum.item<double>();
  };
  int64_t packed_tokens = 0, separate_tokens = 0;
  const double packed_sum = loss_of(packed, &packed_tokens);
  double separate_sum = 0;
  for (const auto& r : rows) {
    int64_t n = 0;
    separate_sum += loss_of({r}, &n);
    separate_tokens += n;
  }
  EXPECT_EQ(packed_tokens, separate_tokens);
  EXPECT_NEAR(packed_sum, separate_sum, 1e-5 * separate_sum);
}

TEST(SftSamples, CollatePadsRight) {
  TrainingRow a{{5, 6, 7}, {kIgnoreLabel, 6, 7}, {0, 1, 2}}, b{{8}, {kIgnoreLabel}, {0}};
  const auto batch = hp::data::collate_rows({&a, &b}, 99);
  EXPECT_EQ(batch.rows, 2);
  EXPECT_EQ(batch.length, 3);
  EXPECT_EQ(batch.input_ids, (std::vector<int64_t>{5, 6, 7, 8, 99, 99}));
  EXPECT_EQ(batch.labels, (std::vector<int64_t>{kIgnoreLabel, 6, 7, kIgnoreLabel, kIgnoreLabel, kIgnoreLabel}));
  EXPECT_EQ(batch.attention_mask, (std::vector<int64_t>{1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(batch.position_ids, (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(batch.label_tokens(), 2);
  EXPECT_EQ(hp::data::collate_rows({&a}, 0, 8).length, 8);
}
