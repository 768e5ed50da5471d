// The caching CPU allocator. See platform/host_allocator.h.
#include "hyperparallel/platform/host_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <unordered_map>

namespace hyperparallel::platform {
namespace {

constexpr size_t kMinCached = 1u << 20;
constexpr size_t kGranule = 64u << 10;  // a multiple of the page size: any granule unmaps alone

// Free address ranges, found by size (best fit) and by address (merging neighbours).
class FreeRanges {
 public:
  // Adds [base, base + size), merged with free ranges that touch it.
  void add(char* base, size_t size) {
    auto next = by_address_.lower_bound(base);
    if (next != by_address_.end() && next->first == base + size) {
      size += next->second;
      erase(next++);
    }
    if (next != by_address_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == base) {
        base = prev->first;
        size += prev->second;
        erase(prev);
      }
    }
    by_address_.emplace(base, size);
    by_size_.emplace(size, base);
    bytes_ += size;
  }

  // The start of `size` bytes carved from the smallest free range that holds them (the rest
  // stays free), or null.
  char* take(size_t size) {
    const auto fit = by_size_.lower_bound({size, nullptr});
    if (fit == by_size_.end()) return nullptr;
    const auto [found_size, base] = *fit;
    erase(by_address_.find(base));
    if (found_size > size) add(base + size, found_size - size);
    return base;
  }

  // Removes the largest free range into (base, size); false when there is none.
  bool pop_largest(char*& base, size_t& size) {
    if (by_size_.empty()) return false;
    const auto largest = std::prev(by_size_.end());
    size = largest->first;
    base = largest->second;
    erase(by_address_.find(base));
    return true;
  }

  uint64_t bytes() const { return bytes_; }
  uint64_t count() const { return by_address_.size(); }

 private:
  void erase(std::map<char*, size_t>::iterator it) {
    by_size_.erase({it->second, it->first});
    bytes_ -= it->second;
    by_address_.erase(it);
  }

  std::map<char*, size_t> by_address_;
  std::set<std::pair<size_t, char*>> by_size_;
  uint64_t bytes_ = 0;
};

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
    void* base = take_or_map(size);
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
    free_.add(static_cast<char*>(base), size);
    unmap_free_above(limit_);
  }

  void release_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    unmap_free_above(0);
  }

  HostAllocatorStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    HostAllocatorStats s = stats_;
    s.cached_bytes = free_.bytes();
    s.free_blocks = free_.count();
    s.mapped_bytes = s.live_bytes + s.cached_bytes;
    return s;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_live_bytes = stats_.live_bytes;
    stats_.peak_mapped_bytes = stats_.live_bytes + free_.bytes();
  }

  void set_limit(uint64_t limit) {
    std::lock_guard<std::mutex> lock(mutex_);
    limit_ = limit;
    unmap_free_above(limit_);
  }

  static Cache* instance;

 private:
  static void release(void* base) { instance->give_back(base); }

  // `size` bytes, live from here: carved from a free block, or newly mapped after unmapping
  // at least as many free bytes (when there are that many), so the mapped total only grows
  // when the live total does.
  void* take_or_map(size_t size) {
    std::unique_lock<std::mutex> lock(mutex_);
    char* base = free_.take(size);
    if (base) {
      ++stats_.hits;
    } else {
      ++stats_.misses;
      unmap_free_above(free_.bytes() > size ? free_.bytes() - size : 0);
      void* mapped = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (mapped == MAP_FAILED) throw std::bad_alloc();
      base = static_cast<char*>(mapped);
    }
    live_.emplace(base, size);
    stats_.live_bytes += size;
    stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
    stats_.peak_mapped_bytes = std::max(stats_.peak_mapped_bytes, stats_.live_bytes + free_.bytes());
    return base;
  }

  // Unmaps free ranges, largest first, until at most `keep` free bytes remain.
  void unmap_free_above(uint64_t keep) {
    char* base = nullptr;
    size_t size = 0;
    while (free_.bytes() > keep && free_.pop_largest(base, size)) munmap(base, size);
  }

  c10::Allocator* fallback_;
  mutable std::mutex mutex_;  // guards free_, live_, stats_, limit_
  FreeRanges free_;
  std::unordered_map<void*, size_t> live_;  // large blocks in use -> their size
  HostAllocatorStats stats_;
  uint64_t limit_ = 0;
};

Cache* Cache::instance = nullptr;
std::once_flag install_once;

uint64_t mem_total_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024;
    meminfo.ignore(1 << 10, '\n');
  }
  return 0;
}

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

void CachingHostAllocator::reset_peak() {
  if (Cache::instance) Cache::instance->reset_peak();
}

uint64_t CachingHostAllocator::default_limit(int ranks_on_this_machine) {
  constexpr uint64_t kMaxPerRank = 16ull << 30;
  const uint64_t total = mem_total_bytes();
  if (total == 0) return 1ull << 30;  // no /proc/meminfo: a modest cache
  return std::min(kMaxPerRank, total / 4 / static_cast<uint64_t>(std::max(1, ranks_on_this_machine)));
}

}  // namespace hyperparallel::platform
