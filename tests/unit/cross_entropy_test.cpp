// The fused cross-entropy (models/cross_entropy.h) against ATen's, and its row kernels at every
// vector width this CPU runs.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <ATen/ATen.h>

#include "models/cross_entropy.h"
#include "models/linear_cross_entropy.h"
#include "models/softmax_rows.h"

namespace hp = hyperparallel;

namespace {

double max_abs(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

}  // namespace

TEST(Models, CrossEntropySumMatchesAtenWithIgnoredLabels) {
  for (const int64_t vocab : {1003, 16, 5}) {
    SCOPED_TRACE(vocab);
    const at::Tensor logits = (at::randn({37, vocab}) * 4).requires_grad_(true);
    at::Tensor labels = at::randint(vocab, {37}, at::kLong);
    labels.narrow(0, 3, 5).fill_(-100);
    const at::Tensor expected = at::cross_entropy_loss(logits, labels, {}, at::Reduction::Sum, -100);
    const at::Tensor got = hp::models::cross_entropy_sum(logits, labels);
    EXPECT_NEAR(got.item<double>(), expected.item<double>(), 1e-5 * expected.item<double>());
    const at::Tensor want = torch::autograd::grad({expected * 0.3}, {logits})[0];
    const at::Tensor have = torch::autograd::grad({got * 0.3}, {logits})[0];
    EXPECT_LE(max_abs(have, want), 1e-6);
    EXPECT_TRUE(have.narrow(0, 3, 5).eq(0).all().item<bool>());  // ignored rows get no gradient
  }
}

// bf16 logits (bf16 compute) give, bit for bit, the fp32 function of their exact fp32 cast,
// and a bf16 gradient that is the fp32 gradient rounded once: what the cast-then-loss path
// computed, without the [N, V] fp32 copy.
TEST(Models, CrossEntropySumOfBf16LogitsIsTheFp32FunctionOfTheirCast) {
  for (const int64_t vocab : {1003, 16}) {
    SCOPED_TRACE(vocab);
    const at::Tensor bf16 = (at::randn({37, vocab}) * 4).to(at::kBFloat16).requires_grad_(true);
    const at::Tensor fp32 = bf16.detach().to(at::kFloat).requires_grad_(true);
    at::Tensor labels = at::randint(vocab, {37}, at::kLong);
    labels.narrow(0, 3, 5).fill_(-100);
    const at::Tensor got = hp::models::cross_entropy_sum(bf16, labels), want = hp::models::cross_entropy_sum(fp32, labels);
    EXPECT_EQ(got.scalar_type(), at::kFloat);
    EXPECT_EQ(got.item<float>(), want.item<float>());
    const at::Tensor have = torch::autograd::grad({got * 0.3}, {bf16})[0];
    EXPECT_EQ(have.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(have.equal(torch::autograd::grad({want * 0.3}, {fp32})[0].to(at::kBFloat16)));
  }
}

TEST(Models, CrossEntropySumOfOnlyIgnoredLabelsIsZero) {
  const at::Tensor logits = at::randn({4, 9}).requires_grad_(true);
  const at::Tensor got = hp::models::cross_entropy_sum(logits, at::full({4}, -100, at::kLong));
  EXPECT_EQ(got.item<double>(), 0.0);
  EXPECT_TRUE(torch::autograd::grad({got}, {logits})[0].eq(0).all().item<bool>());
}

TEST(Models, CrossEntropySumRefusesALabelOutsideTheVocabulary) {
  const at::Tensor logits = at::randn({3, 9});
  for (const int64_t bad : {9, -1}) {
    try {
      hp::models::cross_entropy_sum(logits, at::tensor(std::vector<int64_t>{1, bad, 2}));
      ADD_FAILURE() << "label " << bad << " accepted";
    } catch (const c10::IndexError& e) {
      EXPECT_NE(std::string(e.what()).find("Target " + std::to_string(bad) + " is out of bounds"), std::string::npos) << e.what();
    }
  }
}

TEST(Models, CrossEntropyRowsMatchAtenAtEveryWidth) {
  for (const int lanes : hp::models::softmax_row_widths()) {
    for (const int64_t vocab : {1, 7, 16, 1003}) {
      SCOPED_TRACE(std::to_string(lanes) + " lanes, vocab " + std::to_string(vocab));
      const at::Tensor x = at::randn({5, vocab}) * 6;
      at::Tensor lse = at::empty({5});
      hp::models::log_sum_exp(x.data_ptr<float>(), 5, vocab, lse.data_ptr<float>(), lanes);
      EXPECT_LE(max_abs(lse, at::logsumexp(x, {1})), 1e-5);
      const at::Tensor labels = at::tensor(std::vector<int64_t>{0, vocab - 1, -100, vocab / 2, 0});
      const at::Tensor scale = at::tensor(std::vector<float>{0.5f, 2.0f, 0.0f, 1.0f, -1.0f});
      at::Tensor out = at::empty({5, vocab});
      hp::models::softmax_minus_one_hot(x.data_ptr<float>(), lse.data_ptr<float>(), labels.data_ptr<int64_t>(), scale.data_ptr<float>(), 5,
                                        vocab, out.data_ptr<float>(), lanes);
      const at::Tensor one_hot = at::one_hot(labels.clamp_min(0), vocab).to(at::kFloat) * labels.ge(0).unsqueeze(1);
      // Probabilities to a few float ulps, times scales up to 2.
      EXPECT_LE(max_abs(out, (at::softmax(x, 1) - one_hot) * scale.unsqueeze(1)), 4e-6);
      // bf16 rows (widened in cache): the fp32 kernels' bits on the cast values, rounded once.
      const at::Tensor xb = x.to(at::kBFloat16), xw = xb.to(at::kFloat);
      at::Tensor lse_b = at::empty({5}), lse_w = at::empty({5});
      const auto bits = [](const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); };
      hp::models::log_sum_exp_bf16(bits(xb), 5, vocab, lse_b.data_ptr<float>(), lanes);
      hp::models::log_sum_exp(xw.data_ptr<float>(), 5, vocab, lse_w.data_ptr<float>(), lanes);
      EXPECT_TRUE(lse_b.equal(lse_w));
      at::Tensor out_b = at::empty({5, vocab}, at::kBFloat16), out_w = at::empty({5, vocab});
      hp::models::softmax_minus_one_hot_bf16(bits(xb), lse_w.data_ptr<float>(), labels.data_ptr<int64_t>(), scale.data_ptr<float>(), 5, vocab,
                                             bits(out_b), lanes);
      hp::models::softmax_minus_one_hot(xw.data_ptr<float>(), lse_w.data_ptr<float>(), labels.data_ptr<int64_t>(), scale.data_ptr<float>(), 5,
                                        vocab, out_w.data_ptr<float>(), lanes);
      EXPECT_TRUE(out_b.equal(out_w.to(at::kBFloat16)));
    }
  }
}

TEST(Models, CrossEntropySumKeepsNaN) {
  at::Tensor logits = at::randn({3, 40});
  logits[1][7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(hp::models::cross_entropy_sum(logits, at::tensor(std::vector<int64_t>{1, 2, 3})).item<double>()));
}

// The head and loss fused per chunk (models/linear_cross_entropy.h) against at::linear and
// ATen's cross-entropy: the sum and both gradients, any chunk size, ignored labels; a frozen
// weight gets no gradient; a label outside the vocabulary is refused.
TEST(Models, LinearCrossEntropySumMatchesTheHeadAndAtenLoss) {
  const at::Tensor hidden = at::randn({29, 24}).requires_grad_(true);
  const at::Tensor weight = (at::randn({301, 24}) * 0.2).requires_grad_(true);
  at::Tensor labels = at::randint(301, {29}, at::kLong);
  labels.narrow(0, 4, 6).fill_(-100);
  const at::Tensor expected = at::cross_entropy_loss(at::linear(hidden, weight), labels, {}, at::Reduction::Sum, -100);
  const auto want = torch::autograd::grad({expected * 0.3}, {hidden, weight});
  for (const int64_t chunk : {1, 7, 29, 1000}) {
    SCOPED_TRACE(chunk);
    const at::Tensor got = hp::models::linear_cross_entropy_sum(hidden, weight, labels, chunk);
    EXPECT_NEAR(got.item<double>(), expected.item<double>(), 1e-5 * expected.item<double>());
    const auto have = torch::autograd::grad({got * 0.3}, {hidden, weight});
    EXPECT_LE(max_abs(have[0], want[0]), 1e-6);
    EXPECT_LE(max_abs(have[1], want[1]), 1e-6);
  }
  const at::Tensor frozen = weight.detach();
  const at::Tensor only_hidden = hp::models::linear_cross_entropy_sum(hidden, frozen, labels, 5);
  EXPECT_LE(max_abs(torch::autograd::grad({only_hidden * 0.3}, {hidden})[0], want[0]), 1e-6);
  at::Tensor bad = labels.clone();
  bad[2] = 301;
  EXPECT_THROW(hp::models::linear_cross_entropy_sum(hidden, weight, bad, 5), c10::IndexError);
}

// bf16: the logits' gradient rounded to bf16 once per element, as cross_entropy_sum's backward
// rounds it; compared with the fp32 function of the same bf16 inputs.
TEST(Models, LinearCrossEntropySumOfBf16IsCloseToFp32) {
  const at::Tensor hidden32 = at::randn({40, 32}), weight32 = at::randn({257, 32}) * 0.2;
  const at::Tensor labels = at::randint(257, {40}, at::kLong);
  const at::Tensor hidden = hidden32.to(at::kBFloat16).requires_grad_(true), weight = weight32.to(at::kBFloat16).requires_grad_(true);
  const at::Tensor h = hidden.detach().to(at::kFloat).requires_grad_(true), w = weight.detach().to(at::kFloat).requires_grad_(true);
  const at::Tensor got = hp::models::linear_cross_entropy_sum(hidden, weight, labels, 16);
  const at::Tensor ref = hp::models::linear_cross_entropy_sum(h, w, labels, 16);
  EXPECT_NEAR(got.item<double>(), ref.item<double>(), 2e-2 * ref.item<double>());
  const auto have = torch::autograd::grad({got}, {hidden, weight});
  const auto want = torch::autograd::grad({ref}, {h, w});
  EXPECT_EQ(have[0].scalar_type(), at::kBFloat16);
  EXPECT_EQ(have[1].scalar_type(), at::kBFloat16);
  EXPECT_LE(max_abs(have[0].to(at::kFloat), want[0]), 2e-2 * want[0].abs().max().item<double>());
  EXPECT_LE(max_abs(have[1].to(at::kFloat), want[1]), 2e-2 * want[1].abs().max().item<double>());
}
