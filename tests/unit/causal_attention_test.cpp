// The tiled attention kernel (models/causal_attention.h) against the eager core written out
// here with ATen's ops, as transformers computes it: outputs and the gradients of q, k and v,
// with grouped KV heads, left and right padding (rows that see no key),
// packed documents, cached keys (decoding) and sequences that are not a multiple of the tile.
#include <gtest/gtest.h>
#include <cstdio>
#include <torch/csrc/autograd/autograd.h>

#include <ATen/ATen.h>

#include "models/causal_attention.h"
#include "models/decoder.h"
#include "models/softmax_rows.h"
#include "hyperparallel/platform/host_allocator.h"
#include "support/multiprocess.h"

namespace hp = hyperparallel;

namespace {

struct Case {
  const char* name;
  int64_t batch, kv_heads, groups, seq, past, dim;
  bool padding, documents;
};

double max_abs(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// The eager core on q [B, H, T, D], k, v [B, KV, S, D]; returns [B, H, T, D]. In bf16 the
// products, scale and mask add run in bf16 and the softmax in fp32, as transformers runs it.
at::Tensor eager_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scaling) {
  const int64_t groups = q.size(1) / k.size(1);
  const at::Tensor kr = k.repeat_interleave(groups, 1), vr = v.repeat_interleave(groups, 1);
  const at::Tensor scores = at::matmul(q, kr.transpose(2, 3)) * scaling + mask;
  return at::matmul(at::softmax(scores, -1, at::kFloat).to(q.scalar_type()), vr);
}

uint16_t* bf16_bits(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

at::Tensor case_mask(const Case& c, at::ScalarType dtype = at::kFloat) {
  at::Tensor attention_mask, position_ids;
  const int64_t keys = c.past + c.seq;
  if (c.padding) {  // row 0 left-padded (its first positions see no key), the last row right-padded
    attention_mask = at::ones({c.batch, keys}, at::kLong);
    attention_mask[0].narrow(0, 0, std::min<int64_t>(keys - 1, c.past + 7)).zero_();
    attention_mask[c.batch - 1].narrow(0, keys - 3, 3).zero_();
  }
  if (c.documents) {
    position_ids = at::cat({at::arange(c.seq / 3), at::arange(c.seq - c.seq / 3)}).view({1, c.seq}).expand({c.batch, c.seq});
  }
  return hp::models::build_attention_mask(c.batch, c.seq, attention_mask, position_ids, c.documents, dtype, c.past);
}

}  // namespace

TEST(Models, CausalAttentionMatchesTheEagerCore) {
  const Case cases[] = {
      {"tiles, GQA, padding", 2, 2, 2, 300, 0, 16, true, false},
      {"one tile, documents", 2, 1, 3, 40, 0, 8, false, true},
      {"cached keys", 2, 2, 2, 5, 200, 16, true, false},
      {"decoding one token", 3, 2, 1, 1, 130, 8, true, false},
      {"exactly two tiles", 1, 2, 4, 256, 0, 32, false, true},
  };
  const double scaling = 0.3;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t heads = c.kv_heads * c.groups, keys = c.past + c.seq;
    const at::Tensor q = at::randn({c.batch, heads, c.seq, c.dim}).requires_grad_(true);
    const at::Tensor k = at::randn({c.batch, c.kv_heads, keys, c.dim}).requires_grad_(true);
    const at::Tensor v = at::randn({c.batch, c.kv_heads, keys, c.dim}).requires_grad_(true);
    const at::Tensor mask = case_mask(c);
    const at::Tensor expected = eager_core(q, k, v, mask, scaling);
    // The kernel's row order: t * G + g per KV head.
    const at::Tensor q_rows = q.view({c.batch, c.kv_heads, c.groups, c.seq, c.dim}).transpose(2, 3).reshape({c.batch, c.kv_heads, -1, c.dim});
    const at::Tensor raw = hp::models::causal_attention(q_rows, k, v, mask, scaling);
    const at::Tensor got = raw.view({c.batch, c.kv_heads, c.seq, c.groups, c.dim}).transpose(2, 3).reshape(expected.sizes());
    EXPECT_LE(max_abs(got, expected), 1e-5);
    const at::Tensor gy = at::randn(expected.sizes());
    const auto want = torch::autograd::grad({expected}, {q, k, v}, {gy});
    const auto have = torch::autograd::grad({got}, {q, k, v}, {gy});
    for (size_t i = 0; i < 3; ++i) EXPECT_LE(max_abs(have[i], want[i]), 1e-4 * std::max(1.0, want[i].abs().max().item<double>())) << i;
    // Without a graph the kernel keeps no probabilities and returns the same numbers.
    at::NoGradGuard no_grad;
    EXPECT_TRUE(hp::models::causal_attention(q_rows, k, v, mask, scaling).equal(raw.detach()));
  }
}

// A left-padded row sees no key: the eager core spreads it uniformly over the whole row (every
// key, future ones included), and so does the kernel, which computes such a tile unskipped.
TEST(Models, CausalAttentionSpreadsARowWithNoVisibleKeyOverTheWholeRow) {
  const Case c{"left padding", 1, 1, 1, 300, 0, 8, true, false};
  const at::Tensor q = at::randn({1, 1, 300, 8}), k = at::randn({1, 1, 300, 8}), v = at::randn({1, 1, 300, 8});
  const at::Tensor out = hp::models::causal_attention(q, k, v, case_mask(c), 0.5);
  EXPECT_LE(max_abs(out[0][0][0], v[0][0].mean(0)), 1e-5);
}

// The row kernels at every vector width this CPU runs, against ATen's softmax and its backward:
// row lengths under, at and over a vector, masked entries, a row with no visible entry, two rows
// per mask row.
TEST(Models, SoftmaxRowsMatchAtenAtEveryWidth) {
  const float lowest = std::numeric_limits<float>::lowest();
  for (const int lanes : hp::models::softmax_row_widths()) {
    for (const int64_t keys : {1, 7, 16, 37, 512}) {
      SCOPED_TRACE(std::to_string(lanes) + " lanes, " + std::to_string(keys) + " keys");
      const int64_t rows = 6, per_mask_row = 2;
      const at::Tensor scores = at::randn({rows, keys}) * 5;
      at::Tensor mask = at::zeros({rows / per_mask_row, keys});
      mask[0].narrow(0, keys / 2, keys - keys / 2).fill_(lowest);
      mask[1].fill_(lowest);
      const at::Tensor x = scores * 0.7f + mask.repeat_interleave(per_mask_row, 0);
      const at::Tensor expected = at::softmax(x, -1);
      at::Tensor probs = at::empty({rows, keys}), stats = at::empty({rows, 2});
      hp::models::scaled_masked_softmax(scores.data_ptr<float>(), rows, keys, 0.7f, mask.data_ptr<float>(), keys, per_mask_row,
                                        probs.data_ptr<float>(), stats.data_ptr<float>(), lanes);
      EXPECT_LE(max_abs(probs, expected), 1e-6);
      // From the kept stats, the same probabilities bit for bit (the attention backward's recomputation).
      at::Tensor again = at::empty({rows, keys});
      hp::models::scaled_masked_softmax_from_stats(scores.data_ptr<float>(), rows, keys, 0.7f, mask.data_ptr<float>(), keys, per_mask_row,
                                                   stats.data_ptr<float>(), again.data_ptr<float>(), lanes);
      EXPECT_TRUE(again.equal(probs));
      const at::Tensor grad = at::randn({rows, keys});
      const at::Tensor expected_grad = at::_softmax_backward_data(grad, expected, -1, at::kFloat) * 0.7f;
      at::Tensor got = grad.clone();  // in place, as the kernel's backward runs it
      hp::models::scaled_softmax_backward(probs.data_ptr<float>(), got.data_ptr<float>(), rows, keys, 0.7f, got.data_ptr<float>(), lanes);
      EXPECT_LE(max_abs(got, expected_grad), 1e-5 * std::max(1.0, expected_grad.abs().max().item<double>()));
      // bf16 tiles (widened in cache): the fp32 rows' bits on the cast values, rounded once.
      const at::Tensor scores_b = scores.to(at::kBFloat16), grad_b = grad.to(at::kBFloat16);
      at::Tensor probs_b = at::empty({rows, keys}, at::kBFloat16), probs_w = scores_b.to(at::kFloat);
      hp::models::scaled_masked_softmax_bf16(bf16_bits(scores_b), rows, keys, 0.7f, mask.data_ptr<float>(), keys, per_mask_row,
                                             bf16_bits(probs_b), stats.data_ptr<float>(), lanes);
      at::Tensor again_b = at::empty({rows, keys}, at::kBFloat16);
      hp::models::scaled_masked_softmax_from_stats_bf16(bf16_bits(scores_b), rows, keys, 0.7f, mask.data_ptr<float>(), keys, per_mask_row,
                                                        stats.data_ptr<float>(), bf16_bits(again_b), lanes);
      EXPECT_TRUE(again_b.equal(probs_b));
      hp::models::scaled_masked_softmax(probs_w.data_ptr<float>(), rows, keys, 0.7f, mask.data_ptr<float>(), keys, per_mask_row,
                                        probs_w.data_ptr<float>(), nullptr, lanes);
      EXPECT_TRUE(probs_b.equal(probs_w.to(at::kBFloat16)));
      at::Tensor grad_w = grad_b.to(at::kFloat), p_w = probs_b.to(at::kFloat);
      hp::models::scaled_softmax_backward_bf16(bf16_bits(probs_b), bf16_bits(grad_b), rows, keys, 0.7f, bf16_bits(grad_b), lanes);
      hp::models::scaled_softmax_backward(p_w.data_ptr<float>(), grad_w.data_ptr<float>(), rows, keys, 0.7f, grad_w.data_ptr<float>(), lanes);
      EXPECT_TRUE(grad_b.equal(grad_w.to(at::kBFloat16)));
    }
  }
}

// bf16: the kernel's output and gradients are at least as close to the fp32 core's on the same
// bf16 inputs as the eager core run in bf16 is (its products, scale and mask add in bf16), with
// LibTorch's bf16 GEMMs through oneDNN (AVX512_BF16 CPUs) and through its own gemm (what a CPU
// without AVX-512 runs, which accumulates in bf16).
TEST(Models, CausalAttentionInBf16IsAsCloseToFp32AsTheEagerBf16Core) {
  const Case cases[] = {
      {"tiles, GQA, padding", 2, 2, 2, 300, 0, 16, true, false},
      {"documents", 1, 2, 4, 200, 0, 64, false, true},
      {"cached keys", 2, 2, 4, 24, 200, 32, true, false},
  };
  const double scaling = 0.125;
  const bool mkldnn = at::globalContext().userEnabledMkldnn();
  for (const bool onednn : {true, false}) {
    at::globalContext().setUserEnabledMkldnn(onednn);
    at::manual_seed(11);
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.name) + (onednn ? ", oneDNN" : ", LibTorch's gemm"));
      const int64_t heads = c.kv_heads * c.groups, keys = c.past + c.seq;
      const at::Tensor q16 = at::randn({c.batch, heads, c.seq, c.dim}).to(at::kBFloat16) * 2;
      const at::Tensor k16 = at::randn({c.batch, c.kv_heads, keys, c.dim}).to(at::kBFloat16) * 2;
      const at::Tensor v16 = at::randn({c.batch, c.kv_heads, keys, c.dim}).to(at::kBFloat16);
      const at::Tensor gy16 = at::randn({c.batch, heads, c.seq, c.dim}).to(at::kBFloat16);
      const at::Tensor mask = case_mask(c, at::kBFloat16);  // as the decoder builds it for a bf16 model
      // out, dq, dk, dv in fp32, from operands of `dtype`, through the kernel or the eager core.
      const auto run = [&](at::ScalarType dtype, bool kernel) {
        const at::Tensor q = q16.to(dtype).requires_grad_(true), k = k16.to(dtype).requires_grad_(true);
        const at::Tensor v = v16.to(dtype).requires_grad_(true), m = mask.to(dtype);
        const at::Tensor out =
            kernel ? hp::models::causal_attention_heads(q, k, v, m, scaling).transpose(1, 2) : eager_core(q, k, v, m, scaling);
        EXPECT_EQ(out.scalar_type(), dtype);
        std::vector<at::Tensor> result{out.to(at::kFloat)};
        for (const at::Tensor& g : torch::autograd::grad({out}, {q, k, v}, {gy16.to(dtype)})) result.push_back(g.to(at::kFloat));
        return result;
      };
      const auto truth = run(at::kFloat, false), eager = run(at::kBFloat16, false), kernel = run(at::kBFloat16, true);
      // Mean absolute error over the mean magnitude: steadier than the largest single rounding.
      const auto error = [](const at::Tensor& got, const at::Tensor& want) {
        return (got - want).abs().mean().item<double>() / want.abs().mean().item<double>();
      };
      for (size_t i = 0; i < truth.size(); ++i) {
        const double eager_error = error(eager[i], truth[i]), kernel_error = error(kernel[i], truth[i]);
        EXPECT_LE(kernel_error, 1.3 * eager_error) << i;
        EXPECT_LE(kernel_error, 3e-2) << i;
        std::printf("%s%s [%zu]: mean error / mean |x|: eager bf16 %.2e, kernel bf16 %.2e\n", c.name, onednn ? "" : " (gemm)", i, eager_error,
                    kernel_error);
      }
    }
  }
  at::globalContext().setUserEnabledMkldnn(mkldnn);
}

// The same in bf16, where the items go through batched GEMMs: narrowed keys give the numbers of
// the same keys packed.
TEST(Models, CausalAttentionInBf16TakesNarrowedKeys) {
  const int64_t batch = 2, kv_heads = 2, groups = 2, seq = 140, past = 10, dim = 16;
  const at::Tensor q = at::randn({batch, kv_heads * groups, seq, dim}).to(at::kBFloat16);
  const at::Tensor k_all = at::randn({batch, kv_heads, 200, dim}).to(at::kBFloat16), v_all = at::randn({batch, kv_heads, 200, dim}).to(at::kBFloat16);
  const at::Tensor k = k_all.narrow(2, 0, past + seq), v = v_all.narrow(2, 0, past + seq);
  const at::Tensor mask = hp::models::build_attention_mask(1, seq, at::Tensor(), at::Tensor(), false, at::kBFloat16, past);
  const at::Tensor narrowed = hp::models::causal_attention_heads(q, k, v, mask, 0.25);
  EXPECT_TRUE(narrowed.equal(hp::models::causal_attention_heads(q, k.contiguous(), v.contiguous(), mask, 0.25)));
  EXPECT_LE(max_abs(narrowed.to(at::kFloat), eager_core(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), mask.to(at::kFloat), 0.25).transpose(1, 2)),
            5e-2);
}

// Context parallelism's use: keys narrowed out of a longer tensor (a view, not packed per
// batch) and one mask row shared by the whole batch.
TEST(Models, CausalAttentionTakesNarrowedKeysAndABroadcastMask) {
  const int64_t batch = 2, kv_heads = 2, groups = 2, seq = 40, past = 10, dim = 8;
  const at::Tensor q = at::randn({batch, kv_heads * groups, seq, dim}).requires_grad_(true);
  const at::Tensor k_all = at::randn({batch, kv_heads, 60, dim}).requires_grad_(true);
  const at::Tensor v_all = at::randn({batch, kv_heads, 60, dim}).requires_grad_(true);
  const at::Tensor k = k_all.narrow(2, 0, past + seq), v = v_all.narrow(2, 0, past + seq);
  const at::Tensor mask = hp::models::build_attention_mask(1, seq, at::Tensor(), at::Tensor(), false, at::kFloat, past);
  ASSERT_EQ(mask.size(0), 1);
  const at::Tensor expected = eager_core(q, k, v, mask, 0.25);
  const at::Tensor q_rows = q.view({batch, kv_heads, groups, seq, dim}).transpose(2, 3).reshape({batch, kv_heads, -1, dim});
  const at::Tensor got = hp::models::causal_attention(q_rows, k, v, mask, 0.25)
                             .view({batch, kv_heads, seq, groups, dim})
                             .transpose(2, 3)
                             .reshape(expected.sizes());
  EXPECT_LE(max_abs(got, expected), 1e-5);
  const at::Tensor gy = at::randn(expected.sizes());
  const auto want = torch::autograd::grad({expected}, {q, k_all, v_all}, {gy});
  const auto have = torch::autograd::grad({got}, {q, k_all, v_all}, {gy});
  for (size_t i = 0; i < 3; ++i) EXPECT_LE(max_abs(have[i], want[i]), 1e-4 * std::max(1.0, want[i].abs().max().item<double>())) << i;
}

TEST(Models, CausalAttentionRefusesAMaskOfOtherShape) {
  const at::Tensor q = at::randn({1, 1, 8, 4}), k = at::randn({1, 1, 8, 4});
  const at::Tensor wide_mask = at::zeros({1, 1, 8, 9});
  EXPECT_FALSE(hp::models::causal_attention_supports(q, at::zeros({1, 2, 8, 8})));  // per-head masks take the eager ops
  try {
    hp::models::causal_attention(q, k, k, wide_mask, 1.0);
    ADD_FAILURE() << "a mask over 9 keys accepted for 8";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("the mask must be [B or 1, 1, T, 8]; got [1, 1, 8, 9]"), std::string::npos) << e.what();
  }
}

// A NaN score makes its row NaN (a diverging run shows it), and only its row.
TEST(Models, SoftmaxRowsKeepNaN) {
  for (const int lanes : hp::models::softmax_row_widths()) {
    SCOPED_TRACE(lanes);
    at::Tensor scores = at::randn({2, 37});
    scores[0][20] = std::numeric_limits<float>::quiet_NaN();
    const at::Tensor mask = at::zeros({2, 37});
    at::Tensor probs = at::empty({2, 37});
    hp::models::scaled_masked_softmax(scores.data_ptr<float>(), 2, 37, 1.0f, mask.data_ptr<float>(), 37, 1, probs.data_ptr<float>(), nullptr,
                                      lanes);
    EXPECT_TRUE(probs[0].isnan().all().item<bool>());
    EXPECT_FALSE(probs[1].isnan().any().item<bool>());
    const at::Tensor scores_b = scores.to(at::kBFloat16);  // and through the bf16 rows
    at::Tensor probs_b = at::empty({2, 37}, at::kBFloat16);
    hp::models::scaled_masked_softmax_bf16(bf16_bits(scores_b), 2, 37, 1.0f, mask.data_ptr<float>(), 37, 1, bf16_bits(probs_b), nullptr,
                                           lanes);
    EXPECT_TRUE(probs_b[0].isnan().all().item<bool>());
    EXPECT_FALSE(probs_b[1].isnan().any().item<bool>());
  }
}

// For backward the core keeps its inputs and each row's softmax stats, not the [B, KV, T*G, S]
// probabilities (16 MiB here); its gradients still match the eager core's. Measured with the
// caching host allocator's live bytes, in a process of its own.
TEST(Models, AttentionBackwardRecomputesTheForwardProbabilitiesExactly) {
  hp::testing::run_on_ranks(1, [](hp::testing::RankContext&) {
    hp::platform::CachingHostAllocator::install(1ull << 30);
    at::manual_seed(3);
    const int64_t batch = 2, kv = 4, groups = 2, seq = 512, dim = 64;
    const at::Tensor q = at::randn({batch, kv, seq * groups, dim}).requires_grad_(true);
    const at::Tensor k = at::randn({batch, kv, seq, dim}).requires_grad_(true), v = at::randn({batch, kv, seq, dim}).requires_grad_(true);
    const at::Tensor mask = hp::models::build_attention_mask(batch, seq, at::Tensor(), at::Tensor(), false, at::kFloat, 0);
    const uint64_t before = hp::platform::CachingHostAllocator::stats().live_bytes;
    const at::Tensor out = hp::models::causal_attention(q, k, v, mask, 0.125);
    const uint64_t held = hp::platform::CachingHostAllocator::stats().live_bytes - before;
    const uint64_t probs_bytes = static_cast<uint64_t>(batch * kv * seq * groups * seq) * 4;
    EXPECT_LT(held, out.nbytes() + probs_bytes / 16) << "held " << held << " bytes for an output of " << out.nbytes();
    const at::Tensor grad = at::randn_like(out);
    const auto got = torch::autograd::grad({out}, {q, k, v}, {grad});
    // The eager core on the same values, its query heads h = kv * G + g.
    const auto heads = [&](const at::Tensor& rows) {
      return rows.view({batch, kv, seq, groups, dim}).permute({0, 1, 3, 2, 4}).reshape({batch, kv * groups, seq, dim});
    };
    const at::Tensor q2 = q.detach().clone().requires_grad_(true), k2 = k.detach().clone().requires_grad_(true);
    const at::Tensor v2 = v.detach().clone().requires_grad_(true);
    const at::Tensor eager = eager_core(heads(q2), k2, v2, mask, 0.125);
    EXPECT_LE(max_abs(heads(out), eager), 1e-5);
    const auto want = torch::autograd::grad({eager}, {q2, k2, v2}, {heads(grad)});
    for (size_t i = 0; i < 3; ++i) EXPECT_LE(max_abs(got[i], want[i]), 1e-4 * std::max(1.0, want[i].abs().max().item<double>())) << i;
  });
}
