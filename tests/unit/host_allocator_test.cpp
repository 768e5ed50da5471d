// The caching host allocator: large blocks come back for the next request of their size,
// small ones go to LibTorch's allocator, and the cache can be emptied.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

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

// c10's raw interface keeps only the data pointer (oneDNN's bf16 matmul allocates its scratch
// this way): both a cached block and a small default-allocator block free from it alone.
TEST(HostAllocator, RawAllocationsFreeFromTheirPointerAlone) {
  CachingHostAllocator::install();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  ASSERT_NE(allocator->raw_deleter(), nullptr);
  CachingHostAllocator::release_cached();
  const auto before = CachingHostAllocator::stats();
  void* large = allocator->raw_allocate(3u << 20);
  void* small = allocator->raw_allocate(64);
  EXPECT_EQ(CachingHostAllocator::stats().live_bytes, before.live_bytes + (4u << 20));
  allocator->raw_deallocate(large);
  allocator->raw_deallocate(small);
  EXPECT_EQ(CachingHostAllocator::stats().live_bytes, before.live_bytes);
  EXPECT_EQ(CachingHostAllocator::stats().cached_bytes, 4u << 20);
  // A bf16 matmul large enough for oneDNN's scratch, as the trainer's bf16 steps run it. The
  // inner dimension is 256, exact even where LibTorch accumulates bf16 in bf16 (no AVX-512,
  // platform/bf16_matmul.h).
  const at::Tensor a = at::ones({512, 256}, at::kBFloat16), b = at::ones({256, 512}, at::kBFloat16);
  EXPECT_EQ(at::matmul(a, b).to(at::kFloat).mean().item<float>(), 256.0f);
  EXPECT_EQ(at::linear(a, b.t()).to(at::kFloat).mean().item<float>(), 256.0f);
}
