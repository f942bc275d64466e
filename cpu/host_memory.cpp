#include "cpu/host_memory.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define ATTOGRAD_HOST_MAPS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTOGRAD_HOST_MAPS 0
#endif
#endif
#if !defined(ATTOGRAD_HOST_MAPS) && defined(__linux__)
#define ATTOGRAD_HOST_MAPS 1
#elif !defined(ATTOGRAD_HOST_MAPS)
#define ATTOGRAD_HOST_MAPS 0
#endif

namespace attograd::cpu {
namespace {

constexpr std::size_t kPageBytes = 4096;

std::size_t rounded(std::size_t nbytes, std::size_t unit) {
  return (std::max<std::size_t>(nbytes, 1) + unit - 1) / unit * unit;
}

bool is_large(std::size_t nbytes) { return rounded(nbytes, 64) >= kHugePageBytes; }

// The bytes a large block maps (and so unmaps): whole pages.
std::size_t mapped_bytes(std::size_t nbytes) { return rounded(nbytes, kPageBytes); }

#if ATTOGRAD_HOST_MAPS
// A mapping of whole pages starting on a 2 MiB boundary: map 2 MiB more than
// needed and unmap what lies before the boundary and after the block.
void* map_aligned(std::size_t size) {
  const std::size_t span = size + kHugePageBytes;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (aligned > start) munmap(raw, aligned - start);
  const std::uintptr_t end = start + span, used_end = aligned + size;
  if (end > used_end) munmap(reinterpret_cast<void*>(used_end), end - used_end);
  return reinterpret_cast<void*>(aligned);
}
#endif

}  // namespace

void* allocate_host(std::size_t nbytes) {
  const std::size_t size = rounded(nbytes, 64);
#if ATTOGRAD_HOST_MAPS
  if (is_large(nbytes)) {
    void* p = map_aligned(mapped_bytes(nbytes));
    // Advice only: where THP is off (or "always") nothing changes, and a
    // failure leaves ordinary pages.
    if (p) madvise(p, size / kHugePageBytes * kHugePageBytes, MADV_HUGEPAGE);
    return p;
  }
#endif
  const std::size_t alignment = size >= kHugePageBytes ? kHugePageBytes : 64;
  void* p = nullptr;
  if (posix_memalign(&p, alignment, size) != 0) return nullptr;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (alignment == kHugePageBytes) madvise(p, size / kPageBytes * kPageBytes, MADV_HUGEPAGE);
#endif
  return p;
}

bool large_blocks_mapped() { return ATTOGRAD_HOST_MAPS != 0; }

void free_host(void* p, std::size_t nbytes) {
  if (!p) return;
#if ATTOGRAD_HOST_MAPS
  if (is_large(nbytes)) {
    munmap(p, mapped_bytes(nbytes));
    return;
  }
#endif
  (void)nbytes;
  std::free(p);
}

}  // namespace attograd::cpu
