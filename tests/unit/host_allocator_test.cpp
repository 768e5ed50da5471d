// The caching host allocator: freed large blocks serve later requests of any size that fits
// (split, and merged back when their neighbours are freed), small ones go to LibTorch's
// allocator, and the memory it maps never exceeds the peak of what was live at once.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "hyperparallel/platform/host_allocator.h"

namespace hp = hyperparallel;
using hp::platform::CachingHostAllocator;

namespace {

constexpr uint64_t kMiB = 1u << 20;
constexpr uint64_t kTestLimit = 1ull << 30;

// Each test starts from an empty cache with a known limit; the binary's other tests may have
// installed it before.
void fresh_cache(uint64_t limit = kTestLimit) {
  CachingHostAllocator::install(limit);
  CachingHostAllocator::release_cached();
}

char* bytes_of(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

bool all_zero(const at::Tensor& t) {
  const float* data = t.data_ptr<float>();
  return std::all_of(data, data + t.numel(), [](float x) { return x == 0.0f; });
}

}  // namespace

TEST(HostAllocator, FreedBlocksServeSmallerRequestsAndMergeBack) {
  fresh_cache();
  ASSERT_TRUE(CachingHostAllocator::installed());
  char* first = nullptr;
  {
    at::Tensor t = at::full({2 * 1024 * 1024}, 2.0);  // 8 MiB
    first = bytes_of(t);
  }
  const auto before = CachingHostAllocator::stats();
  EXPECT_EQ(before.cached_bytes, 8 * kMiB);
  {
    at::Tensor five = at::zeros({5 * 256 * 1024});  // 5 MiB from the front of the freed block
    at::Tensor three = at::zeros({3 * 256 * 1024});  // and the 3 MiB left of it
    EXPECT_EQ(bytes_of(five), first);
    EXPECT_EQ(bytes_of(three), first + 5 * kMiB);
    EXPECT_TRUE(all_zero(five) && all_zero(three));  // read in place: an op's result would be one more block
    const auto during = CachingHostAllocator::stats();
    EXPECT_EQ(during.hits, before.hits + 2);
    EXPECT_EQ(during.misses, before.misses);
    EXPECT_EQ(during.cached_bytes, 0u);
    EXPECT_EQ(during.live_bytes, before.live_bytes + 8 * kMiB);
  }
  const auto merged = CachingHostAllocator::stats();
  EXPECT_EQ(merged.cached_bytes, 8 * kMiB);
  EXPECT_EQ(merged.free_blocks, 1u);  // the two halves are one block again
  {
    at::Tensor whole = at::empty({2 * 1024 * 1024});
    EXPECT_EQ(bytes_of(whole), first);
  }
  const auto misses = CachingHostAllocator::stats().misses;
  { at::Tensor small = at::ones({100}); }  // below 1 MiB: not counted, not cached
  EXPECT_EQ(CachingHostAllocator::stats().misses, misses);
  CachingHostAllocator::release_cached();
  EXPECT_EQ(CachingHostAllocator::stats().cached_bytes, 0u);
}

// A new size every step, as variable-length batches bring: what the old exact-size cache
// kept grew with every new size; here the mapped total stays at the peak of one step's
// live bytes, and the contents of live blocks never overlap.
TEST(HostAllocator, MappedBytesNeverExceedThePeakLiveBytes) {
  fresh_cache();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  std::mt19937_64 rng(7);
  struct Live {
    char* data;
    size_t bytes;
    unsigned char mark;
  };
  std::vector<Live> live;
  uint64_t peak_live = 0, live_now = 0;
  for (int op = 0; op < 3000; ++op) {
    const bool allocate = live.empty() || (live.size() < 24 && rng() % 2 == 0);
    if (allocate) {
      const size_t bytes = kMiB + rng() % (48 * kMiB);  // not granule multiples
      auto* data = static_cast<char*>(allocator->raw_allocate(bytes));
      const auto mark = static_cast<unsigned char>(op);
      data[0] = static_cast<char>(mark);
      data[bytes - 1] = static_cast<char>(mark);
      live.push_back({data, bytes, mark});
      live_now += (bytes + (64u << 10) - 1) / (64u << 10) * (64u << 10);
      peak_live = std::max(peak_live, live_now);
    } else {
      const size_t i = rng() % live.size();
      const Live block = live[i];
      ASSERT_EQ(static_cast<unsigned char>(block.data[0]), block.mark) << "op " << op;
      ASSERT_EQ(static_cast<unsigned char>(block.data[block.bytes - 1]), block.mark) << "op " << op;
      allocator->raw_deallocate(block.data);
      live_now -= (block.bytes + (64u << 10) - 1) / (64u << 10) * (64u << 10);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    const auto s = CachingHostAllocator::stats();
    ASSERT_EQ(s.live_bytes, live_now) << "op " << op;
    ASSERT_LE(s.mapped_bytes, peak_live) << "op " << op;
  }
  for (const Live& block : live) allocator->raw_deallocate(block.data);
  const auto s = CachingHostAllocator::stats();
  EXPECT_LE(s.peak_mapped_bytes, s.peak_live_bytes);
  EXPECT_GT(s.hits, s.misses);  // reuse, not a fresh mapping per request
  CachingHostAllocator::release_cached();
}

TEST(HostAllocator, FreeBytesAboveTheLimitGoBack) {
  fresh_cache(/*limit=*/12 * kMiB);
  {
    std::vector<at::Tensor> held;
    for (int i = 0; i < 4; ++i) held.push_back(at::empty({2 * 1024 * 1024}));  // 4 x 8 MiB
  }
  EXPECT_LE(CachingHostAllocator::stats().cached_bytes, 12 * kMiB);
  CachingHostAllocator::install(kTestLimit);  // a later install sets the limit
  CachingHostAllocator::release_cached();
}

TEST(HostAllocator, DefaultLimitSharesAQuarterOfTheMachineBetweenItsRanks) {
  const uint64_t ram = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t one = CachingHostAllocator::default_limit(1);
  EXPECT_GT(one, 0u);
  EXPECT_LE(one, std::min<uint64_t>(16ull << 30, ram / 4));
  EXPECT_LE(CachingHostAllocator::default_limit(4) * 4, ram / 4);
  EXPECT_EQ(CachingHostAllocator::default_limit(0), one);  // nonsense counts as one rank
}

// c10's raw interface keeps only the data pointer (oneDNN's bf16 matmul allocates its scratch
// this way): both a cached block and a small default-allocator block free from it alone.
TEST(HostAllocator, RawAllocationsFreeFromTheirPointerAlone) {
  fresh_cache();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  ASSERT_NE(allocator->raw_deleter(), nullptr);
  const auto before = CachingHostAllocator::stats();
  void* large = allocator->raw_allocate(3 * kMiB + 1);
  void* small = allocator->raw_allocate(64);
  EXPECT_EQ(CachingHostAllocator::stats().live_bytes, before.live_bytes + 3 * kMiB + (64u << 10));
  allocator->raw_deallocate(large);
  allocator->raw_deallocate(small);
  EXPECT_EQ(CachingHostAllocator::stats().live_bytes, before.live_bytes);
  EXPECT_EQ(CachingHostAllocator::stats().cached_bytes, 3 * kMiB + (64u << 10));
  // A bf16 matmul large enough for oneDNN's scratch, as the trainer's bf16 steps run it. The
  // inner dimension is 256, exact even where LibTorch accumulates bf16 in bf16 (no AVX-512,
  // platform/bf16_matmul.h).
  const at::Tensor a = at::ones({512, 256}, at::kBFloat16), b = at::ones({256, 512}, at::kBFloat16);
  EXPECT_EQ(at::matmul(a, b).to(at::kFloat).mean().item<float>(), 256.0f);
  EXPECT_EQ(at::linear(a, b.t()).to(at::kFloat).mean().item<float>(), 256.0f);
}
