// Zero-bubble's weight pass (src/pp/weight_pass.h) on small graphs: the weight gradients equal
// one full backward's, the input path is not run again (a counting node on it), the groups
// that must replay do (a weight applied twice in sequence, a parameter that reaches an output
// off the input path, a segment without an input, an output off that path used inside), hooks
// inside the segment are called again in W, and one engine task around W runs an
// end-of-backward callback once.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include "pp/weight_pass.h"

namespace hyperparallel::pp {
namespace {

using torch::autograd::AutogradContext;

// Identity whose backward counts its calls (the counter's address travels in saved_data).
struct CountingIdentity : torch::autograd::Function<CountingIdentity> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t* counter) {
    ctx->saved_data["counter"] = reinterpret_cast<int64_t>(counter);
    return x.clone();
  }
  static torch::autograd::variable_list backward(AutogradContext* ctx, torch::autograd::variable_list grads) {
    ++*reinterpret_cast<int64_t*>(ctx->saved_data["counter"].toInt());
    return {grads[0], at::Tensor()};
  }
};

at::Tensor leaf(std::vector<int64_t> shape, int64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn(shape, gen, at::kFloat).requires_grad_(true);
}

std::vector<at::Tensor> copies(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(t.detach().clone().requires_grad_(true));
  return out;
}

void expect_same_grads(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].grad().defined()) << "parameter " << i;
    EXPECT_TRUE(at::allclose(got[i].grad(), want[i].grad(), 1e-6, 1e-6)) << "parameter " << i;
  }
}

// I: the input's gradient (graph kept), then stop capturing, as the pipeline does.
at::Tensor input_pass(SegmentWeights& w, const at::Tensor& out, const at::Tensor& input, const at::Tensor& grad) {
  at::Tensor g = torch::autograd::grad({out}, {input}, {grad}, /*retain_graph=*/true)[0];
  w.stop_capture();
  return g;
}

TEST(WeightPass, WeightGradientsStartAtTheirJunctionsAndMatchOneBackward) {
  const at::Tensor x = leaf({6, 8}, 1), grad = leaf({6, 5}, 2).detach();
  const std::vector<at::Tensor> params{leaf({8, 8}, 3), leaf({8}, 4), leaf({8, 5}, 5)};
  auto layer = [](const at::Tensor& in, const std::vector<at::Tensor>& p, int64_t* counter) {
    const at::Tensor h = CountingIdentity::apply(at::matmul(in, p[0]), counter);
    return at::matmul(at::tanh(h) * p[1], p[2]);
  };
  int64_t ref_count = 0, count = 0;
  const std::vector<at::Tensor> ref = copies(params);
  const at::Tensor ref_x = x.detach().clone().requires_grad_(true);
  layer(ref_x, ref, &ref_count).backward(grad);

  const at::Tensor y = layer(x, params, &count);
  SegmentWeights weights({y}, x, params);
  EXPECT_EQ(weights.direct_groups(), 3);
  EXPECT_EQ(weights.replayed_groups(), 0);
  const at::Tensor gx = input_pass(weights, y, x, grad);
  EXPECT_TRUE(at::allclose(gx, ref_x.grad(), 1e-6, 1e-6));
  for (const auto& p : params) EXPECT_FALSE(p.grad().defined());  // I computes no weight gradient
  EXPECT_EQ(count, 1);
  weights.accumulate({grad});
  EXPECT_EQ(count, 1);  // W did not walk the input path again
  EXPECT_FALSE(x.grad().defined());
  expect_same_grads(params, ref);
}

TEST(WeightPass, AWeightAppliedTwiceInSequenceReplaysExactly) {
  const at::Tensor x = leaf({4, 6}, 11), grad = leaf({4, 6}, 12).detach();
  const std::vector<at::Tensor> params{leaf({6, 6}, 13)};
  auto layer = [](const at::Tensor& in, const at::Tensor& w) { return at::tanh(at::matmul(at::tanh(at::matmul(in, w)), w)); };
  const std::vector<at::Tensor> ref = copies(params);
  layer(x.detach(), ref[0]).backward(grad);

  const at::Tensor y = layer(x, params[0]);
  SegmentWeights weights({y}, x, params);
  EXPECT_EQ(weights.replayed_groups(), 1);  // the later use's junction reaches the earlier one
  input_pass(weights, y, x, grad);
  weights.accumulate({grad});
  expect_same_grads(params, ref);
}

TEST(WeightPass, AParameterReachingAnOutputOffTheInputPathReplays) {
  const at::Tensor x = leaf({4, 6}, 21), grad = leaf({4, 3}, 22).detach();
  const std::vector<at::Tensor> params{leaf({6, 3}, 23), leaf({3}, 24)};
  auto outputs = [](const at::Tensor& in, const std::vector<at::Tensor>& p) {
    return std::vector<at::Tensor>{at::matmul(in, p[0]) + p[1], (p[0] * p[0]).sum()};
  };
  const at::Tensor one = at::ones({});
  const std::vector<at::Tensor> ref = copies(params);
  torch::autograd::backward(outputs(x.detach(), ref), {grad, one});

  const std::vector<at::Tensor> out = outputs(x, params);
  SegmentWeights weights(out, x, params);
  EXPECT_EQ(weights.replayed_groups(), 1);  // p[0]: through its square to the second output
  EXPECT_EQ(weights.direct_groups(), 1);    // p[1]: only through the sum
  torch::autograd::grad(out, {x}, {grad, one}, /*retain_graph=*/true);
  weights.stop_capture();
  weights.accumulate({grad, one});
  expect_same_grads(params, ref);
}

TEST(WeightPass, ASegmentWithoutAnInputReplaysEverything) {
  const at::Tensor ids = at::arange(5, at::kLong), grad = leaf({5, 4}, 31).detach();
  const std::vector<at::Tensor> params{leaf({10, 4}, 32)};
  const std::vector<at::Tensor> ref = copies(params);
  at::embedding(ref[0], ids).backward(grad);
  const at::Tensor y = at::embedding(params[0], ids);
  SegmentWeights weights({y}, at::Tensor(), params);
  EXPECT_EQ(weights.replayed_groups(), 1);
  weights.accumulate({grad});
  expect_same_grads(params, ref);
}

TEST(WeightPass, OneBackwardAroundManyEngineCallsEndsOnceAndFiresOutputHooks) {
  const at::Tensor x = leaf({3, 4}, 41), grad = leaf({3, 4}, 42).detach();
  const std::vector<at::Tensor> params{leaf({4, 4}, 43), leaf({4, 4}, 44)};
  const at::Tensor y = at::matmul(at::matmul(x, params[0]), params[1]);
  at::Tensor seen;
  y.register_hook([&](const at::Tensor& g) { seen = g; });
  SegmentWeights weights({y}, x, params);
  EXPECT_EQ(weights.direct_groups(), 2);
  input_pass(weights, y, x, grad);
  seen = at::Tensor();
  int64_t callbacks = 0, callbacks_in_body = -1;
  run_as_one_backward([&] {
    torch::autograd::Engine::get_default_engine().queue_callback([&] { ++callbacks; });
    weights.accumulate({grad});  // the output's hook, then two engine calls, one per parameter
    callbacks_in_body = callbacks;
  });
  EXPECT_EQ(callbacks_in_body, 0);
  EXPECT_EQ(callbacks, 1);
  ASSERT_TRUE(seen.defined());
  EXPECT_TRUE(at::equal(seen, grad));
  EXPECT_TRUE(params[0].grad().defined() && params[1].grad().defined());
}

// A hook on a tensor inside the segment, above the junctions (as FSDP registers on a unit's
// output inside a layer), is called again in W with the gradient it saw in I.
TEST(WeightPass, AHookInsideTheSegmentIsCalledAgainInW) {
  const at::Tensor x = leaf({3, 4}, 51), grad = leaf({3, 4}, 52).detach();
  const std::vector<at::Tensor> params{leaf({4, 4}, 53), leaf({4, 4}, 54)};
  const at::Tensor h = at::tanh(at::matmul(x, params[0]));
  std::vector<at::Tensor> seen;
  h.register_hook([&](const at::Tensor& g) { seen.push_back(g.clone()); });
  const at::Tensor y = at::matmul(h, params[1]);
  SegmentWeights weights({y}, x, params);
  EXPECT_EQ(weights.direct_groups(), 2);
  input_pass(weights, y, x, grad);
  ASSERT_EQ(seen.size(), 1u);
  run_as_one_backward([&] { weights.accumulate({grad}); });
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_TRUE(at::equal(seen[1], seen[0]));
}

// An output that does not depend on the input and is also used inside the segment: its own
// gradient enters at its node, which no junction sees, so the parameter replays.
TEST(WeightPass, AnOutputOffTheInputPathUsedInsideTheSegmentReplays) {
  const at::Tensor x = leaf({4, 3}, 61), grad = leaf({4, 3}, 62).detach(), z_grad = leaf({3}, 63).detach();
  const std::vector<at::Tensor> params{leaf({3, 3}, 64), leaf({3}, 65)};
  auto outputs = [](const at::Tensor& in, const std::vector<at::Tensor>& p) {
    const at::Tensor z = p[1] * 2;
    return std::vector<at::Tensor>{at::matmul(in, p[0]) + z, z};
  };
  const std::vector<at::Tensor> ref = copies(params);
  torch::autograd::backward(outputs(x.detach(), ref), {grad, z_grad});

  const std::vector<at::Tensor> out = outputs(x, params);
  SegmentWeights weights(out, x, params);
  EXPECT_EQ(weights.replayed_groups(), 1);  // p[1], through z
  EXPECT_EQ(weights.direct_groups(), 1);    // p[0]
  torch::autograd::grad({out[0]}, {x}, {grad}, /*retain_graph=*/true);
  weights.stop_capture();
  weights.accumulate({grad, z_grad});
  expect_same_grads(params, ref);
}

}  // namespace
}  // namespace hyperparallel::pp
