// Pretraining data (stage pt): .txt / .jsonl / .json texts as LlamaFactory reads them, blocks
// of cutoff_len cut exactly (eos per text, every token a label, positions over the whole
// block), the loss of a block checked against Hugging Face's causal-LM loss through a model,
// the config rules, and a run through the command line.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hyperparallel/data/dataset_registry.h"
#include "hyperparallel/data/pretrain_dataset.h"
#include "hyperparallel/data/pretrain_samples.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/train/train_config.h"
#include "support/subprocess.h"
#include "support/test_files.h"

namespace hp = hyperparallel;
namespace fs = std::filesystem;
using hp::data::BadRecordPolicy;
using hp::data::DatasetFormat;
using hp::data::kIgnoreLabel;
using hp::data::PretrainOptions;
using hp::data::TextSample;
using hp::data::Tokenizer;
using hp::data::TrainingRow;

namespace {

const std::string kFixtures = HP_SOURCE_DIR "/tests/fixtures/tokenizer";

std::string temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "hp_pt_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<std::string> texts_of(const std::vector<TextSample>& samples) {
  std::vector<std::string> out;
  for (const auto& s : samples) out.push_back(s.text);
  return out;
}

std::vector<int64_t> concat(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

// HF's "text" loader: \n, \r\n and a lone \r end a line; a blank line is an (empty) text; the
// final break starts nothing. Bad lines stop or are skipped with file:line; max_samples.
TEST(PretrainData, TxtLinesAreTextsAsTheHfTextLoaderReadsThem) {
  const std::string dir = temp_dir("txt");
  const std::string path = hp::testing::write_text_file(dir + "/wiki.txt", "first line\nsecond\r\nthird\rfourth\n\n  sixth  \nlast, no break");
  const auto texts = hp::data::load_text_file(path, DatasetFormat::kAlpaca);
  EXPECT_EQ(texts_of(texts), (std::vector<std::string>{"first line", "second", "third", "fourth", "", "  sixth  ", "last, no break"}));
  EXPECT_EQ(texts[0].source, path + ":1");
  EXPECT_EQ(texts[6].source, path + ":7");
  EXPECT_EQ(hp::data::load_text_file(hp::testing::write_text_file(dir + "/two.txt", "a\nb\n"), DatasetFormat::kAlpaca).size(), 2u);  // no third
  EXPECT_TRUE(hp::data::load_text_file(hp::testing::write_text_file(dir + "/empty.txt", ""), DatasetFormat::kAlpaca).empty());

  hp::data::SftLoadOptions first3;
  first3.max_samples = 3;
  EXPECT_EQ(texts_of(hp::data::load_text_file(path, DatasetFormat::kAlpaca, first3)),
            (std::vector<std::string>{"first line", "second", "third"}));

  const std::string bad = hp::testing::write_text_file(dir + "/bad.txt", "good\nbad \xff byte\nalso good\n");
  EXPECT_NE(hp::testing::user_error_of([&] { hp::data::load_text_file(bad, DatasetFormat::kAlpaca); })
                .find(bad + ":2: not valid UTF-8 (at byte 5 of the line) (set the bad-record policy to skip"),
            std::string::npos);
  hp::data::SftLoadOptions skip;
  skip.on_bad_record = BadRecordPolicy::kSkip;
  hp::data::SftLoadReport report;
  const auto kept = hp::data::load_text_file(bad, DatasetFormat::kAlpaca, skip, &report);
  EXPECT_EQ(texts_of(kept), (std::vector<std::string>{"good", "also good"}));
  EXPECT_EQ(kept[1].source, bad + ":3");
  ASSERT_EQ(report.skipped.size(), 1u);
  EXPECT_EQ(report.skipped[0], bad + ":2: not valid UTF-8 (at byte 5 of the line)");
}

// c4_demo's layout ({"text": ...} with "columns": {"prompt": "text"}), a renamed column, alpaca
// records (prompt + "\n" + query; the response is not read), sharegpt (the first user turn), a
// folder of .txt and .jsonl files; bad records; max_samples per dataset; the errors.
TEST(PretrainData, DatasetInfoEntriesGiveTextsAsLlamaFactoryReadsThem) {
  const std::string dir = temp_dir("registry");
  hp::testing::write_text_file(dir + "/dataset_info.json", R"({
    "c4_demo": {"file_name": "c4.jsonl", "columns": {"prompt": "text"}},
    "renamed": {"file_name": "renamed.json", "columns": {"prompt": "content"}},
    "with_query": {"file_name": "renamed.json", "columns": {"prompt": "content", "query": "extra"}},
    "alpaca": {"file_name": "alpaca.json"},
    "chats": {"file_name": "chats.jsonl", "formatting": "sharegpt"},
    "wiki_demo": {"file_name": "wiki.txt", "columns": {"prompt": "text"}},
    "plain_txt": {"file_name": "wiki.txt"},
    "txt_renamed": {"file_name": "wiki.txt", "columns": {"prompt": "content"}},
    "folder": {"file_name": "parts", "columns": {"prompt": "text"}},
    "csv": {"file_name": "table.csv"},
    "bad": {"file_name": "bad.jsonl", "columns": {"prompt": "text"}}
  })");
  hp::testing::write_text_file(dir + "/c4.jsonl", R"({"text": "Doc one.", "input": "not read", "meta": 1})" "\n" R"({"text": "Doc two.\nWith a newline."})" "\n");
  hp::testing::write_text_file(dir + "/renamed.json", R"([{"content": "c1", "extra": "e1"}, {"content": "", "extra": "e2"}, {"content": "c3"}])");
  hp::testing::write_text_file(dir + "/alpaca.json", R"([{"instruction": "Say hi", "input": "to Bob", "output": "Hi Bob", "system": "s"},
                                  {"instruction": "Count", "output": "1 2 3"}])");
  hp::testing::write_text_file(dir + "/chats.jsonl",
        R"({"conversations": [{"from": "system", "value": "sys"}, {"from": "human", "value": "question"}, {"from": "gpt", "value": "answer"}]})" "\n");
  hp::testing::write_text_file(dir + "/wiki.txt", "Line A\nLine B\n");
  hp::testing::write_text_file(dir + "/parts/b.txt", "from b.txt\n");
  hp::testing::write_text_file(dir + "/parts/a.jsonl", R"({"text": "from a.jsonl"})" "\n");
  hp::testing::write_text_file(dir + "/parts/notes.md", "not a dataset file\n");
  hp::testing::write_text_file(dir + "/table.csv", "text\nx\n");
  hp::testing::write_text_file(dir + "/bad.jsonl", R"({"text": "ok"})" "\n" R"({"txt": "typo"})" "\n" "{oops\n" R"({"text": 5})" "\n" R"({"text": "ok2"})" "\n");

  const auto load = [&](const std::string& names, const hp::data::SftLoadOptions& o = {}, hp::data::SftLoadReport* r = nullptr) {
    return texts_of(hp::data::load_text_datasets(names, dir, o, r));
  };
  EXPECT_EQ(load("c4_demo"), (std::vector<std::string>{"Doc one.", "Doc two.\nWith a newline."}));
  EXPECT_EQ(load("renamed"), (std::vector<std::string>{"c1", "", "c3"}));  // "extra" is not named: not read
  EXPECT_EQ(load("with_query"), (std::vector<std::string>{"c1\ne1", "e2", "c3"}));
  EXPECT_EQ(load("alpaca"), (std::vector<std::string>{"Say hi\nto Bob", "Count"}));
  EXPECT_EQ(load("chats"), (std::vector<std::string>{"question"}));
  EXPECT_EQ(load("wiki_demo"), (std::vector<std::string>{"Line A", "Line B"}));
  EXPECT_EQ(load("plain_txt"), load("wiki_demo"));
  EXPECT_EQ(load("folder"), (std::vector<std::string>{"from a.jsonl", "from b.txt"}));  // name order, .md left out
  EXPECT_EQ(load("wiki_demo, c4_demo").size(), 4u);
  const auto sources = hp::data::load_text_datasets("c4_demo", dir);
  EXPECT_EQ(sources[1].source, dir + "/c4.jsonl:2");
  hp::data::SftLoadOptions one;
  one.max_samples = 1;
  EXPECT_EQ(load("wiki_demo,c4_demo,folder", one), (std::vector<std::string>{"Line A", "Doc one.", "from a.jsonl"}));

  EXPECT_NE(hp::testing::user_error_of([&] { load("bad"); }).find(dir + "/bad.jsonl:2: missing \"text\""), std::string::npos);
  hp::data::SftLoadOptions skip;
  skip.on_bad_record = BadRecordPolicy::kSkip;
  hp::data::SftLoadReport report;
  EXPECT_EQ(load("bad", skip, &report), (std::vector<std::string>{"ok", "ok2"}));
  ASSERT_EQ(report.skipped.size(), 3u);
  EXPECT_EQ(report.skipped[0], dir + "/bad.jsonl:2: missing \"text\"");
  EXPECT_NE(report.skipped[1].find(dir + "/bad.jsonl:3: not valid JSON"), std::string::npos) << report.skipped[1];
  EXPECT_EQ(report.skipped[2], dir + "/bad.jsonl:4: \"text\" must be a string");

  EXPECT_NE(hp::testing::user_error_of([&] { load("txt_renamed"); })
                .find("wiki.txt is plain text, whose one column is \"text\", but \"columns\" names \"content\" as the prompt; "
                      "set \"columns\": {\"prompt\": \"text\"}"),
            std::string::npos);
  EXPECT_NE(hp::testing::user_error_of([&] { load("csv"); }).find("table.csv: pretraining texts are read from .txt"), std::string::npos);
  EXPECT_NE(hp::testing::user_error_of([&] { load("synthetic_reverse"); })
                .find("dataset 'synthetic_reverse' is a built-in chat dataset, and stage pt trains on plain text"),
            std::string::npos);
  EXPECT_NE(hp::testing::user_error_of([&] { load("c4demo"); }).find("did you mean 'c4_demo'?"), std::string::npos);
  // SFT does not read plain text.
  EXPECT_NE(hp::testing::user_error_of([&] { hp::data::load_datasets("wiki_demo", dir); }).find("wiki.txt is a plain-text file (one text per line), which trains with stage: pt"),
            std::string::npos);
}

// The eos token LlamaFactory appends, per template, and the bos of tokenizers that add one.
// A dataset file by its path (dataset_file.*): the text column, or each record rendered by a
// text_template as Python's str.format_map renders it ({field}, {{ and }}, str() of numbers,
// booleans and null); a record without a field is a bad record at file:line; a template that
// is not plain {field}s is refused with the fix.
TEST(PretrainData, ADatasetFileGivesItsTextColumnOrItsRenderedTemplate) {
  const std::string dir = temp_dir("file");
  hp::testing::write_text_file(dir + "/r.jsonl", R"({"body": "b1", "q": "x", "n": 3, "f": 0.5, "ok": true, "none": null})" "\n"
                                                 R"({"body": "b2", "q": "y", "n": -1, "f": 1e20, "ok": false, "none": null})" "\n");
  hp::data::DatasetFile file;
  file.path = dir + "/r.jsonl";
  file.column = "body";
  EXPECT_EQ(texts_of(hp::data::load_text_dataset_file(file)), (std::vector<std::string>{"b1", "b2"}));
  file.text_template = "{{{q}}} n={n} f={f} {ok} {none}\t}}";
  EXPECT_EQ(texts_of(hp::data::load_text_dataset_file(file)),
            (std::vector<std::string>{"{x} n=3 f=0.5 True None\t}", "{y} n=-1 f=1e+20 False None\t}"}));
  file.text_template = "{q} {missing}";
  try {
    hp::data::load_text_dataset_file(file);
    ADD_FAILURE() << "a missing field was not named";
  } catch (const hp::UserError& e) {
    EXPECT_NE(std::string(e.what()).find(file.path + ":1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("has no field \"missing\" (text_template)"), std::string::npos) << e.what();
  }
  hp::testing::write_text_file(dir + "/lines.txt", "a line\n");
  hp::data::DatasetFile lines;
  lines.path = dir + "/lines.txt";
  lines.text_template = "{text}";
  try {
    hp::data::load_text_dataset_file(lines);
    ADD_FAILURE() << "a template was applied to plain text";
  } catch (const hp::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("is plain text (one text per line), and text_template renders"), std::string::npos) << e.what();
  }
  for (const std::string bad : {"{q", "q}", "{}", "{0}", "{q.attr}", "{q[0]}", "{q!r}", "{q:>5}"}) {
    file.text_template = bad;
    try {
      hp::data::load_text_dataset_file(file);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const hp::UserError& e) {
      EXPECT_NE(std::string(e.what()).find("write {field} for a record's field and {{ or }} for a brace"), std::string::npos) << e.what();
    }
  }
}

TEST(PretrainData, EosAndBosTokensFollowLlamaFactory) {
  const auto qwen3 = Tokenizer::from_file(kFixtures + "/qwen3");
  const auto llama3 = Tokenizer::from_file(kFixtures + "/llama3");
  const auto mistral = Tokenizer::from_file(kFixtures + "/mistral");
  EXPECT_EQ(hp::data::pretrain_eos_token(qwen3, ""), "<|im_end|>");  // tokenizer_config.json's eos_token
  EXPECT_EQ(hp::data::pretrain_eos_token(qwen3, "qwen3"), "<|im_end|>");
  EXPECT_EQ(hp::data::pretrain_eos_token(qwen3, "default"), "<|im_end|>");
  EXPECT_EQ(hp::data::pretrain_eos_token(llama3, ""), "<|end_of_text|>");
  EXPECT_EQ(hp::data::pretrain_eos_token(llama3, "llama3"), "<|end_of_text|>");  // not the template's <|eot_id|>
  EXPECT_EQ(hp::data::pretrain_eos_token(mistral, "llama2"), "</s>");
  EXPECT_NE(hp::testing::user_error_of([&] { hp::data::pretrain_eos_token(qwen3, "llama3"); })
                .find("stage pt ends every text with <|end_of_text|> (template llama3 ends pretraining texts with it, as "
                      "LlamaFactory does), but the tokenizer has no such token; use the model's own template"),
            std::string::npos);
  EXPECT_NE(hp::testing::user_error_of([&] { hp::data::pretrain_eos_token(mistral, "qwen"); }).find("with <|im_end|>"), std::string::npos);
  EXPECT_TRUE(mistral.special_tokens().add_bos_token);
  EXPECT_FALSE(qwen3.special_tokens().add_bos_token);
  EXPECT_FALSE(llama3.special_tokens().add_bos_token);  // PreTrainedTokenizerFast: its post-processor adds bos, not the attribute
  EXPECT_EQ(hp::data::pretrain_bos_token(mistral), "<s>");
  EXPECT_EQ(hp::data::pretrain_bos_token(qwen3), "");
  EXPECT_EQ(hp::data::pretrain_bos_token(llama3), "");
}

// Packing: the texts, each + eos, concatenated and cut into blocks of exactly cutoff_len; the
// tail left out; labels = ids but the first; positions 0..cutoff_len-1 over each block.
TEST(PretrainData, PackedBlocksAreTheConcatenatedTextsCutExactly) {
  const auto tokenizer = Tokenizer::from_file(kFixtures + "/qwen3");
  const int64_t eos = *tokenizer.token_to_id("<|im_end|>");
  const std::vector<TextSample> texts = {{"The quick brown fox jumps over the lazy dog.", "t:1"},
                                         {"", "t:2"},
                                         {"Pretraining reads every token; nothing is masked.", "t:3"},
                                         {"Unicode too: naïve café, 東京, 🙂.", "t:4"}};
  std::vector<int64_t> stream;
  std::vector<size_t> eos_at;
  for (const auto& t : texts) {
    const auto ids = tokenizer.encode(t.text + "<|im_end|>");
    EXPECT_EQ(ids, concat(tokenizer.encode(t.text), {eos})) << t.text;  // one eos per text, after it
    stream.insert(stream.end(), ids.begin(), ids.end());
    eos_at.push_back(stream.size() - 1);
  }
  PretrainOptions options;
  options.eos_token = "<|im_end|>";
  for (int64_t cutoff : std::vector<int64_t>{2, 7, 16, static_cast<int64_t>(stream.size())}) {
    SCOPED_TRACE(cutoff);
    options.cutoff_len = cutoff;
    hp::data::SampleReport report;
    const auto rows = hp::data::build_pretrain_rows(tokenizer, texts, options, &report);
    const size_t blocks = stream.size() / static_cast<size_t>(cutoff);
    ASSERT_EQ(rows.size(), blocks);
    for (size_t b = 0; b < blocks; ++b) {
      const std::vector<int64_t> expected(stream.begin() + static_cast<std::ptrdiff_t>(b * cutoff),
                                          stream.begin() + static_cast<std::ptrdiff_t>((b + 1) * cutoff));
      EXPECT_EQ(rows[b].input_ids, expected);
      ASSERT_EQ(rows[b].labels.size(), static_cast<size_t>(cutoff));
      EXPECT_EQ(rows[b].labels[0], kIgnoreLabel);
      EXPECT_EQ(std::vector<int64_t>(rows[b].labels.begin() + 1, rows[b].labels.end()),
                std::vector<int64_t>(expected.begin() + 1, expected.end()));
      for (int64_t i = 0; i < cutoff; ++i) EXPECT_EQ(rows[b].position_ids[i], i);  // no restart per document
      EXPECT_EQ(hp::data::label_tokens(rows[b]), cutoff - 1);
    }
    for (size_t at : eos_at) {
      if (at < blocks * cutoff) {
        EXPECT_EQ(rows[at / cutoff].input_ids[at % cutoff], eos);
      }
    }
    const size_t tail = stream.size() - blocks * cutoff;
    EXPECT_EQ(report.truncated, 0);
    if (tail == 0) {
      EXPECT_TRUE(report.dropped.empty());
    } else {
      ASSERT_EQ(report.dropped.size(), 1u);
      EXPECT_EQ(report.dropped[0].find("the last " + std::to_string(tail) + " of " + std::to_string(stream.size()) + " tokens (from t:"), 0u)
          << report.dropped[0];
    }
  }
  options.cutoff_len = static_cast<int64_t>(stream.size()) + 1;
  EXPECT_NE(hp::testing::user_error_of([&] { hp::data::build_pretrain_rows(tokenizer, texts, options); })
                .find("stage pt with packing: the 4 texts give " + std::to_string(stream.size()) + " tokens, fewer than one block of cutoff_len"),
            std::string::npos);
}

// packing: false: one row per text (bos + text + eos), cut at cutoff_len; a one-token row is
// left out. A bos-adding tokenizer (Mistral) prepends bos, or, packed, puts it first in
// each block (replacing that token), as LlamaFactory does.
TEST(PretrainData, UnpackedRowsAreOneTextEachAndBosIsLlamaFactorys) {
  const auto qwen3 = Tokenizer::from_file(kFixtures + "/qwen3");
  const std::vector<TextSample> texts = {{"short text", "t:1"}, {"", "t:2"}, {"a rather longer text that will be cut", "t:3"}};
  PretrainOptions options;
  options.packing = false;
  options.eos_token = "<|im_end|>";
  options.cutoff_len = 5;
  hp::data::SampleReport report;
  const auto rows = hp::data::build_pretrain_rows(qwen3, texts, options, &report);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].input_ids, qwen3.encode("short text<|im_end|>"));
  const auto long_ids = qwen3.encode("a rather longer text that will be cut<|im_end|>");
  EXPECT_EQ(rows[1].input_ids, std::vector<int64_t>(long_ids.begin(), long_ids.begin() + 5));
  for (const auto& row : rows) {
    EXPECT_EQ(row.labels[0], kIgnoreLabel);
    EXPECT_EQ(std::vector<int64_t>(row.labels.begin() + 1, row.labels.end()), std::vector<int64_t>(row.input_ids.begin() + 1, row.input_ids.end()));
    for (size_t i = 0; i < row.position_ids.size(); ++i) EXPECT_EQ(row.position_ids[i], static_cast<int64_t>(i));
  }
  EXPECT_EQ(report.truncated, 1);
  ASSERT_EQ(report.dropped.size(), 1u);
  EXPECT_EQ(report.dropped[0], "t:2: 1 token (an empty text): nothing to predict");

  const auto mistral = Tokenizer::from_file(kFixtures + "/mistral");
  const int64_t bos = *mistral.token_to_id("<s>");
  options.eos_token = hp::data::pretrain_eos_token(mistral, "");
  options.bos_token = hp::data::pretrain_bos_token(mistral);
  options.cutoff_len = 64;
  const auto with_bos = hp::data::build_pretrain_rows(mistral, texts, options);
  ASSERT_EQ(with_bos.size(), 3u);  // the empty text is <s></s>: one prediction
  EXPECT_EQ(with_bos[0].input_ids, mistral.encode("<s>short text</s>"));
  EXPECT_EQ(with_bos[0].input_ids[0], bos);
  EXPECT_EQ(with_bos[1].input_ids, (std::vector<int64_t>{bos, *mistral.token_to_id("</s>")}));
  options.packing = true;
  options.cutoff_len = 4;
  const auto packed = hp::data::build_pretrain_rows(mistral, texts, options);
  std::vector<int64_t> stream;
  for (const auto& t : texts) stream = concat(stream, mistral.encode(t.text + "</s>"));
  ASSERT_EQ(packed.size(), stream.size() / 4);
  for (size_t b = 0; b < packed.size(); ++b) {
    std::vector<int64_t> expected(stream.begin() + static_cast<std::ptrdiff_t>(4 * b), stream.begin() + static_cast<std::ptrdiff_t>(4 * b + 4));
    expected[0] = bos;
    EXPECT_EQ(packed[b].input_ids, expected);
  }
}

// A block's loss through the model is Hugging Face's causal-LM loss of the block: the mean
// cross-entropy of logits[:-1] against ids[1:], with default positions (attention across the
// documents in it).
TEST(PretrainData, BlockLossIsTheHfCausalLmLossOfTheBlock) {
  const auto tokenizer = Tokenizer::from_file(HP_SOURCE_DIR "/examples/tokenizer");
  std::vector<TextSample> texts;
  for (const char* t : {"Reverse the words: sun tree river", "river tree sun", "What is 482 + 37?", "519", "a b c d e f g"}) {
    texts.push_back({t, "t"});
  }
  PretrainOptions options;
  options.cutoff_len = 12;
  options.eos_token = hp::data::pretrain_eos_token(tokenizer, "");
  const auto rows = hp::data::build_pretrain_rows(tokenizer, texts, options);
  ASSERT_GE(rows.size(), 3u);
  std::vector<const TrainingRow*> ptrs;
  for (const auto& r : rows) ptrs.push_back(&r);
  const auto batch = hp::data::collate_rows(ptrs, 0);
  EXPECT_EQ(batch.label_tokens(), static_cast<int64_t>(rows.size()) * (options.cutoff_len - 1));
  const auto tensor = [&](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).view({batch.rows, batch.length}); };
  auto model = hp::models::AutoModelForCausalLM::from_pretrained("qwen3-debug");
  hp::models::CausalLMInput ours;
  ours.input_ids = tensor(batch.input_ids);
  ours.labels = tensor(batch.labels);
  ours.attention_mask = tensor(batch.attention_mask);
  ours.position_ids = tensor(batch.position_ids);
  const auto out = model->forward(ours);
  EXPECT_EQ(out.label_tokens, batch.label_tokens());

  hp::models::CausalLMInput plain;  // what transformers gets from LlamaFactory's pt collator
  plain.input_ids = tensor(batch.input_ids);
  const at::Tensor logits = model->forward(plain).logits;
  const int64_t n = batch.length, vocab = logits.size(2);
  const at::Tensor hf_loss = at::cross_entropy_loss(logits.narrow(1, 0, n - 1).reshape({-1, vocab}),
                                                    plain.input_ids.narrow(1, 1, n - 1).reshape({-1}));
  EXPECT_NEAR(out.lm_loss.item<double>(), hf_loss.item<double>(), 1e-6 * hf_loss.item<double>());
}

// stage pt in a config: no template needed, packing on unless set, and LlamaFactory's refusals.
TEST(PretrainData, ConfigRulesFollowLlamaFactory) {
  const std::string dir = temp_dir("config");
  const auto load = [&](const std::string& extra) {
    return hp::train::load_train_config(
        hp::testing::write_text_file(dir + "/c.yaml", "model_name_or_path: qwen3-debug\nstage: pt\ndataset: c4_demo\noutput_dir: " + dir + "/out\n" + extra));
  };
  const auto plain = load("");
  EXPECT_EQ(plain.stage, "pt");
  EXPECT_TRUE(plain.chat_template.empty());
  EXPECT_TRUE(plain.packing);  // LlamaFactory: packing unset is true for pt
  EXPECT_FALSE(load("packing: false\n").packing);
  EXPECT_TRUE(load("neat_packing: false\n").packing);
  EXPECT_EQ(load("template: qwen3\n").chat_template, "qwen3");
  EXPECT_NE(hp::testing::user_error_of([&] { load("train_on_prompt: true\n"); })
                .find("train_on_prompt: true applies to stage sft only; stage pt takes the loss on every token"),
            std::string::npos);
  EXPECT_NE(hp::testing::user_error_of([&] { load("mask_history: true\n"); }).find("mask_history: true applies to stage sft only"), std::string::npos);
  EXPECT_NE(hp::testing::user_error_of([&] { load("neat_packing: true\n"); }).find("c.yaml: neat_packing: true applies to stage sft only"), std::string::npos);
  EXPECT_NE(hp::testing::user_error_of([&] { load("heldout_eval_samples: 4\n"); }).find("heldout_eval_samples answers chat prompts"), std::string::npos);
  // SFT is unchanged: a template is required and packing stays off unless set.
  const auto sft = hp::train::load_train_config(
      hp::testing::write_text_file(dir + "/s.yaml", "model_name_or_path: qwen3-debug\ndataset: x\ntemplate: qwen3\noutput_dir: " + dir + "/out\n"));
  EXPECT_FALSE(sft.packing);
  EXPECT_NE(hp::testing::user_error_of([&] {
              hp::train::load_train_config(hp::testing::write_text_file(dir + "/n.yaml", "model_name_or_path: qwen3-debug\ndataset: x\noutput_dir: o\n"));
            }).find("template is required for stage sft"),
            std::string::npos);
}

// `hyperparallel train` on a .txt and a .jsonl dataset: LlamaFactory's qwen3_lora_pretrain.yaml
// as a full fine-tuning run (its LoRA keys dropped), the tiny model and tokenizer, 3 steps.
TEST(PretrainData, CommandLineTrainsOnPlainTextAndRefusesABadPtConfig) {
  const std::string dir = temp_dir("cli");
  hp::testing::write_text_file(dir + "/data/dataset_info.json", R"({
    "wiki_demo": {"file_name": "wiki_demo.txt", "columns": {"prompt": "text"}},
    "c4_demo": {"file_name": "c4_demo.jsonl", "columns": {"prompt": "text"}}
  })");
  std::string wiki, c4;
  for (int i = 0; i < 40; ++i) {
    wiki += "Reverse the words: sun tree river " + std::to_string(i) + " is a line of plain text.\n";
    if (i % 7 == 0) wiki += "\n";
    c4 += nlohmann::json({{"text", "What is " + std::to_string(i) + " + 37? It is " + std::to_string(i + 37) + ".\nA second line."}}).dump() + "\n";
  }
  hp::testing::write_text_file(dir + "/data/wiki_demo.txt", wiki);
  hp::testing::write_text_file(dir + "/data/c4_demo.jsonl", c4);
  const std::string out = dir + "/out";
  const std::string yaml = hp::testing::write_text_file(dir + "/qwen3_full_pretrain.yaml",
                                 "### model\n"
                                 "model_name_or_path: qwen3-debug\n"
                                 "tokenizer: " HP_SOURCE_DIR "/examples/tokenizer\n"
                                 "trust_remote_code: true\n"
                                 "\n### method\n"
                                 "stage: pt\ndo_train: true\nfinetuning_type: full\n"
                                 "\n### dataset\n"
                                 "dataset: wiki_demo,c4_demo\n"
                                 "dataset_dir: " + dir + "/data\n"
                                 "cutoff_len: 64\nmax_samples: 1000\npreprocessing_num_workers: 16\ndataloader_num_workers: 4\n"
                                 "\n### output\n"
                                 "output_dir: " + out + "\n"
                                 "logging_steps: 1\nsave_steps: 500\nplot_loss: true\noverwrite_output_dir: true\nsave_only_model: false\n"
                                 "report_to: none  # choices: [none, wandb, tensorboard, swanlab, mlflow]\n"
                                 "\n### train\n"
                                 "per_device_train_batch_size: 1\ngradient_accumulation_steps: 8\nlearning_rate: 1.0e-4\n"
                                 "num_train_epochs: 3.0\nlr_scheduler_type: cosine\nwarmup_ratio: 0.1\nbf16: true\n"
                                 "ddp_timeout: 180000000\nresume_from_checkpoint: null\n");
  // The rows the run must report: the library's own reading of the same files.
  const auto tokenizer = Tokenizer::from_file(HP_SOURCE_DIR "/examples/tokenizer");
  const auto texts = hp::data::load_text_datasets("wiki_demo,c4_demo", dir + "/data");
  EXPECT_EQ(texts.size(), 86u);  // 40 lines + 6 blank ones + 40 records
  PretrainOptions options;
  options.cutoff_len = 64;
  options.eos_token = "<|im_end|>";
  const auto rows = hp::data::build_pretrain_rows(tokenizer, texts, options);

  const auto run = hp::testing::run_subprocess({HP_CLI_PATH, "train", yaml, "max_steps=3"}, {std::chrono::seconds(180)});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("86 texts -> " + std::to_string(rows.size()) + " rows (packed)"), std::string::npos) << run.output;
  std::ifstream log(out + "/trainer_log.jsonl");
  int lines = 0;
  int64_t tokens = 0;
  for (std::string line; std::getline(log, line); ++lines) {
    const auto entry = nlohmann::json::parse(line);
    EXPECT_TRUE(std::isfinite(entry.at("loss").get<double>())) << line;
    EXPECT_GT(entry.at("loss").get<double>(), 0) << line;
    tokens = entry.at("total_tokens").get<int64_t>();
  }
  EXPECT_EQ(lines, 3) << run.output;
  EXPECT_EQ(tokens, 3 * 8 * 64);  // 3 steps of 8 full blocks
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));

  // A bad pt config: exit code 2 and the message.
  const auto bad = hp::testing::run_subprocess({HP_CLI_PATH, "train", yaml, "train_on_prompt=true"}, {std::chrono::seconds(60)});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("train_on_prompt: true applies to stage sft only"), std::string::npos) << bad.output;
  const auto neat = hp::testing::run_subprocess({HP_CLI_PATH, "train", yaml, "neat_packing=true"}, {std::chrono::seconds(60)});
  EXPECT_EQ(neat.exit_code, 2) << neat.output;
  EXPECT_NE(neat.output.find("neat_packing: true applies to stage sft only"), std::string::npos) << neat.output;
}
