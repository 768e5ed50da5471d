// The caching host allocator: large blocks come back for the next request of their size,
// small ones go to LibTorch's allocator, and the cache can be emptied.
#include <gtest/gtest.h>

#include "hyperparallel/platform/host_allocator.h"

namespace hp = hyperparallel;
using hp::platform::CachingHostAllocator;

TEST(HostAllocator, ReusesLargeBlocksAndLeavesSmallOnesAlone) {
  CachingHostAllocator::install();
  ASSERT_TRUE(CachingHostAllocator::installed());
  CachingHostAllocator::release_cached();
  void* first = nullptr;
  {
    at::Tensor t = at::full({1024, 1024}, 2.0);  // 4 MiB
    first = t.data_ptr();
    EXPECT_EQ(t.sum().item<double>(), 2.0 * 1024 * 1024);
  }
  const auto before = CachingHostAllocator::stats();
  EXPECT_EQ(before.cached_bytes, 4u << 20);
  {
    at::Tensor again = at::zeros({1024, 1024});  // same rounded size: the same block, zeroed
    EXPECT_EQ(again.data_ptr(), first);
    EXPECT_EQ(again.abs().sum().item<double>(), 0.0);
    EXPECT_EQ(CachingHostAllocator::stats().hits, before.hits + 1);
    EXPECT_EQ(CachingHostAllocator::stats().live_bytes, before.live_bytes + (4u << 20));
  }
  const auto misses = CachingHostAllocator::stats().misses;
  { at::Tensor small = at::ones({100}); }  // below 1 MiB: not counted, not cached
  EXPECT_EQ(CachingHostAllocator::stats().misses, misses);
  CachingHostAllocator::release_cached();
  EXPECT_EQ(CachingHostAllocator::stats().cached_bytes, 0u);
}
