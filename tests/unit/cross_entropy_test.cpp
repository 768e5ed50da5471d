// The fused cross-entropy (models/cross_entropy.h) against ATen's, and its row kernels at every
// vector width this CPU runs.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <ATen/ATen.h>

#include "models/cross_entropy.h"
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
    }
  }
}

TEST(Models, CrossEntropySumKeepsNaN) {
  at::Tensor logits = at::randn({3, 40});
  logits[1][7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(hp::models::cross_entropy_sum(logits, at::tensor(std::vector<int64_t>{1, 2, 3})).item<double>()));
}
