// CachingHostAllocator: reuse large CPU tensor allocations instead of returning them to the OS.
//
// On these machines fresh memory costs ~3 ms per MiB at first touch, and glibc hands back a
// freed multi-MiB tensor's pages to the kernel (or cannot reuse the hole for the next aligned
// request), so a training step that allocates the same temporaries every iteration (logits,
// attention scores, activations) pays for page faults over and over: a [2048, 32768] fp32
// temporary costs 0.78 s to zero the first time and 0.01 s when its memory is reused.
// This allocator keeps freed blocks of >= 1 MiB (sizes rounded up to 2 MiB) in per-size
// free lists and hands them out again; smaller requests go to LibTorch's default allocator.
// Blocks come from mmap, so memory never touched stays unbacked (deferred initialisation
// keeps working). The cache is bounded (cached_limit_bytes); release_cached() returns it.
//
// LibTorch has one CPU allocator per process, so installing is process-wide: programs call
// install() once at start (the CLI, benchmarks); the library never installs it implicitly.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hyperparallel::platform {

struct HostAllocatorStats {
  uint64_t cached_bytes = 0;   // freed blocks held for reuse
  uint64_t live_bytes = 0;     // large blocks in use
  uint64_t hits = 0;           // large requests served from the cache
  uint64_t misses = 0;         // large requests that mapped new memory
};

class CachingHostAllocator {
 public:
  // Installs the allocator for every CPU tensor allocated afterwards (idempotent).
  static void install(uint64_t cached_limit_bytes = 16ull << 30);
  static bool installed();
  static HostAllocatorStats stats();
  static void release_cached();  // unmap every cached block
};

}  // namespace hyperparallel::platform
