#include "cpu/host_memory.h"

#include <algorithm>
#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace attograd::cpu {

void* allocate_host(std::size_t nbytes) {
  const std::size_t size = (std::max<std::size_t>(nbytes, 1) + 63) / 64 * 64;
  const std::size_t alignment = size >= kHugePageBytes ? kHugePageBytes : 64;
  void* p = nullptr;
  if (posix_memalign(&p, alignment, size) != 0) return nullptr;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Advice only: where THP is off (or "always") nothing changes, and a failure
  // leaves ordinary pages. The range must start on a page, as p does.
  if (alignment == kHugePageBytes) madvise(p, size / 4096 * 4096, MADV_HUGEPAGE);
#endif
  return p;
}

void free_host(void* p) { std::free(p); }

}  // namespace attograd::cpu
