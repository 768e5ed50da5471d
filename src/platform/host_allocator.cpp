// The caching CPU allocator. See platform/host_allocator.h.
#include "hyperparallel/platform/host_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <map>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace hyperparallel::platform {
namespace {

constexpr size_t kMinCached = 1u << 20;
constexpr size_t kGranule = 2u << 20;

// The process's one instance: c10 keeps a raw pointer to the allocator it is given, so it
// must live as long as the process (a function-local static, created by install()).
//
// Every DataPtr it hands out has its data pointer as its context, as c10 requires of an
// allocator with a raw_deleter(): raw_allocate() keeps only the pointer, and
// raw_deallocate() (oneDNN's bf16 matmul scratch goes through it) must free the block from
// the pointer alone. Large blocks are found by address in `live_`; small ones are the default
// allocator's, freed by its own raw deleter.
class Cache final : public c10::Allocator {
 public:
  explicit Cache(c10::Allocator* fallback) : fallback_(fallback) {}

  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes < kMinCached) return fallback_->allocate(nbytes);
    const size_t size = (nbytes + kGranule - 1) / kGranule * kGranule;
    void* base = take_cached(size);
    if (!base) base = map_new(size);
    return {base, base, &Cache::release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Cache::release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  void give_back(void* base) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto it = live_.find(base);
    if (it == live_.end()) {  // one of the default allocator's
      lock.unlock();
      fallback_->raw_deleter()(base);
      return;
    }
    const size_t size = it->second;
    live_.erase(it);
    stats_.live_bytes -= size;
    if (stats_.cached_bytes + size > limit_) {
      munmap(base, size);
      return;
    }
    free_[size].push_back(base);
    stats_.cached_bytes += size;
  }

  void release_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, blocks] : free_) {
      for (void* b : blocks) munmap(b, size);
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
  static void release(void* base) { instance->give_back(base); }

  // A cached block of `size` bytes (now live), or null.
  void* take_cached(size_t size) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(size);
    if (it == free_.end() || it->second.empty()) {
      ++stats_.misses;
      return nullptr;
    }
    void* base = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= size;
    ++stats_.hits;
    live_.emplace(base, size);
    stats_.live_bytes += size;
    return base;
  }

  void* map_new(size_t size) const {
    void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) throw std::bad_alloc();
    std::lock_guard<std::mutex> lock(mutex_);
    live_.emplace(base, size);
    stats_.live_bytes += size;
    return base;
  }

  c10::Allocator* fallback_;
  mutable std::mutex mutex_;  // guards free_, live_, stats_, limit_
  mutable std::map<size_t, std::vector<void*>> free_;
  mutable std::unordered_map<void*, size_t> live_;  // large blocks in use -> their size
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
