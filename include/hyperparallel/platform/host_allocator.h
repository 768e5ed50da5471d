// CachingHostAllocator: reuse large CPU tensor allocations instead of returning them to the OS.
//
// On these machines fresh memory costs ~3 ms per MiB at first touch, and glibc hands back a
// freed multi-MiB tensor's pages to the kernel (or cannot reuse the hole for the next aligned
// request), so a training step that allocates the same temporaries every iteration (logits,
// attention scores, activations) pays for page faults over and over: a [2048, 32768] fp32
// temporary costs 0.78 s to zero the first time and 0.01 s when its memory is reused.
//
// Requests of >= 1 MiB (rounded up to 64 KiB) are served from freed blocks of any size, as
// PyTorch's caching allocators do: the smallest free block that fits is taken and split, the
// rest stays free; a freed block merges with free neighbours in the address space. Smaller
// requests go to LibTorch's default allocator. Blocks come from mmap, so memory never touched
// stays unbacked (deferred initialisation keeps working), and any page range can be unmapped
// on its own, whichever mapping it came from.
//
// Memory is bounded twice. (1) Before mapping new memory for a request no free block fits,
// free blocks (largest first) are unmapped to make room: the bytes mapped never exceed the
// peak of the bytes live at once, so variable-length batches (a new size every step) cannot
// grow the process, whatever the fragmentation. (2) Free bytes above cached_limit_bytes are
// unmapped; default_limit() gives each rank of a machine its share of a quarter of RAM.
//
// LibTorch has one CPU allocator per process, so installing is process-wide: programs call
// install() once at start (the CLI, benchmarks); the library never installs it implicitly.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hyperparallel::platform {

struct HostAllocatorStats {
  uint64_t cached_bytes = 0;       // freed blocks held for reuse
  uint64_t live_bytes = 0;         // large blocks in use
  uint64_t peak_live_bytes = 0;    // the most live_bytes has been
  uint64_t mapped_bytes = 0;       // live + cached: what the cache holds from the OS
  uint64_t peak_mapped_bytes = 0;  // never above peak_live_bytes (bound (1) above)
  uint64_t free_blocks = 0;        // cached_bytes in this many pieces
  uint64_t hits = 0;               // large requests served from the cache
  uint64_t misses = 0;             // large requests that mapped new memory
};

class CachingHostAllocator {
 public:
  // Installs the allocator for every CPU tensor allocated afterwards (idempotent); a later
  // call sets the limit (and trims the cache to it).
  static void install(uint64_t cached_limit_bytes);
  static bool installed();
  static HostAllocatorStats stats();
  static void release_cached();  // unmap every cached block
  static void reset_peak();      // the peaks start again from what is live (mapped) now
  // A quarter of this machine's RAM (MemTotal) shared by the `ranks_on_this_machine` processes
  // that each run a cache, at most 16 GiB each.
  static uint64_t default_limit(int ranks_on_this_machine);
};

}  // namespace hyperparallel::platform
