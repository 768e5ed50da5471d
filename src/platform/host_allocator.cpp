// The caching CPU allocator. See platform/host_allocator.h.
#include "hyperparallel/platform/host_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <map>
#include <mutex>
#include <new>
#include <vector>

namespace hyperparallel::platform {
namespace {

constexpr size_t kMinCached = 1u << 20;
constexpr size_t kGranule = 2u << 20;

struct Block {
  void* base;
  size_t size;
};

// The process's one instance: c10 keeps a raw pointer to the allocator it is given, so it
// must live as long as the process (a function-local static, created by install()).
class Cache final : public c10::Allocator {
 public:
  explicit Cache(c10::Allocator* fallback) : fallback_(fallback) {}

  c10::DataPtr allocate(size_t nbytes) const override {
    if (nbytes < kMinCached) return fallback_->allocate(nbytes);
    const size_t size = (nbytes + kGranule - 1) / kGranule * kGranule;
    Block* block = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        block = it->second.back();
        it->second.pop_back();
        stats_.cached_bytes -= size;
        ++stats_.hits;
      } else {
        ++stats_.misses;
      }
      stats_.live_bytes += size;
    }
    if (!block) {
      void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (base == MAP_FAILED) {
        std::lock_guard<std::mutex> lock(mutex_);
        stats_.live_bytes -= size;
        throw std::bad_alloc();
      }
      block = new Block{base, size};
    }
    return {block->base, block, &Cache::release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void give_back(Block* block) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.live_bytes -= block->size;
    if (stats_.cached_bytes + block->size > limit_) {
      munmap(block->base, block->size);
      delete block;
      return;
    }
    free_[block->size].push_back(block);
    stats_.cached_bytes += block->size;
  }

  void release_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, blocks] : free_) {
      for (Block* b : blocks) {
        munmap(b->base, b->size);
        delete b;
      }
      blocks.clear();
    }
    stats_.cached_bytes = 0;
  }

  HostAllocatorStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void set_limit(uint64_t limit) {
    std::lock_guard<std::mutex> lock(mutex_);
    limit_ = limit;
  }

  static Cache* instance;

 private:
  static void release(void* ctx) { instance->give_back(static_cast<Block*>(ctx)); }

  c10::Allocator* fallback_;
  mutable std::mutex mutex_;
  mutable std::map<size_t, std::vector<Block*>> free_;
  mutable HostAllocatorStats stats_;
  uint64_t limit_ = 0;
};

Cache* Cache::instance = nullptr;
std::once_flag install_once;

}  // namespace

void CachingHostAllocator::install(uint64_t cached_limit_bytes) {
  std::call_once(install_once, [&] {
    static Cache cache(c10::GetDefaultCPUAllocator());
    Cache::instance = &cache;
    c10::SetCPUAllocator(&cache, /*priority=*/1);
  });
  Cache::instance->set_limit(cached_limit_bytes);
}

bool CachingHostAllocator::installed() { return Cache::instance != nullptr; }

HostAllocatorStats CachingHostAllocator::stats() { return Cache::instance ? Cache::instance->stats() : HostAllocatorStats{}; }

void CachingHostAllocator::release_cached() {
  if (Cache::instance) Cache::instance->release_all();
}

}  // namespace hyperparallel::platform
