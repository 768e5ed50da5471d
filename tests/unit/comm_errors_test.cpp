// Bad arguments fail before anything is issued, with a message naming the problem and the
// fix; a collective that a peer never joins fails with CommError after the timeout; a group a
// member drops at once does not break the others still connecting.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/platform/user_error.h"
#include "support/multiprocess.h"

namespace hyperparallel {
namespace {

using comm::ReduceOp;

std::shared_ptr<comm::Communicator> single_process() { return comm::init_process_group(comm::RendezvousInfo{}); }

template <typename F>
std::string user_error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "<no UserError>";
}

TEST(CommErrors, ArgumentsAreCheckedBeforeIssuing) {
  auto c = single_process();
  EXPECT_NE(user_error_of([&] { c->all_gather(at::empty({4}), at::ones({3})); }).find("expected 1 x 3"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] { c->all_gather(at::empty({3}, at::kHalf), at::ones({3})); })
                .find("output dtype Half differs from input dtype Float"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] { c->all_reduce(at::ones({4, 4}).t()); }).find("must be contiguous"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] { c->all_reduce(at::ones({4}, at::kLong), ReduceOp::kAvg); })
                .find("avg needs a floating-point tensor, got Long"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] { c->all_reduce(at::ones({4}, at::kBool), ReduceOp::kSum); })
                .find("bool tensors reduce with max"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] { c->broadcast(at::ones({4}), 1); }).find("root rank 1 is outside the group (size 1)"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] { c->all_to_all(at::empty({3}), at::ones({3}), {2}, {3}); })
                .find("output_splits sum to 2 but the output has 3 rows"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] { c->all_gather(at::empty({4}), at::Tensor()); }).find("input tensor is undefined"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] { c->group({0, 0}, "dup"); }).find("repeats a rank"), std::string::npos);
  EXPECT_NE(user_error_of([&] { c->group({3}, "far"); }).find("rank 3 is outside the world"), std::string::npos);
}

TEST(CommErrors, BoolTravelsAndReducesWithMaxAndMin) {
  auto c = single_process();
  at::Tensor t = at::tensor({1, 0, 1}).to(at::kBool);
  c->all_reduce(t, ReduceOp::kMax).wait();
  EXPECT_TRUE(at::equal(t, at::tensor({1, 0, 1}).to(at::kBool)));
  at::Tensor out = at::empty({3}, at::kBool);
  c->all_gather(out, t).wait();
  EXPECT_TRUE(at::equal(out, t));
}

TEST(CommErrors, ACollectiveAPeerNeverJoinsTimesOut) {
  testing::run_on_ranks(2, [](testing::RankContext& ctx) {
    auto& c = *ctx.world;
    at::Tensor t = at::ones({16});
    if (c.rank() == 0) {
      const auto start = std::chrono::steady_clock::now();
      auto h = c.all_reduce(t);
      try {
        h.wait(std::chrono::milliseconds(300));
        ADD_FAILURE() << "wait() returned although rank 1 had not joined";
      } catch (const comm::CommError& e) {
        EXPECT_NE(std::string(e.what()).find("all_reduce on group 'world' (rank 0 of 2)"), std::string::npos)
            << e.what();
      }
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      c.all_reduce(t).wait();  // completes the one rank 0 gave up waiting for
    }
  });
}

// A member may drop a group the moment it has it: creation ends only when every member has
// connected, so a slower member never finds its peer's sockets already closed.
TEST(CommErrors, AGroupDroppedAtOnceNeverBreaksAMemberStillConnecting) {
  testing::run_on_ranks(4, [](testing::RankContext& ctx) {
    const int base = ctx.rank - ctx.rank % 2;
    for (int i = 0; i < 25; ++i) {
      auto pair = ctx.world->group({base, base + 1}, "pair");
      EXPECT_EQ(pair->size(), 2);
    }  // each drop gives the next creation a fresh generation
  });
}

}  // namespace
}  // namespace hyperparallel
