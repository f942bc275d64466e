#pragma once
// Host memory for tensors and the CPU kernels' scratch. Every block starts on a
// cache line (vector loads and AMX tile rows want 64 bytes); a block of 2 MiB
// or more starts on a 2 MiB boundary and asks Linux for transparent huge pages
// (madvise, Debian's default THP mode), so that a kernel reading a large
// operand along its columns (an AMX tile's 16 rows, each on its own 4 KiB page
// when rows are 4 KiB apart) misses the TLB once per 2 MiB, not once per row.
#include <cstddef>

namespace attograd::cpu {

inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// nbytes (0 counts as 1) of uninitialised memory; null when out of memory.
// Freed by free_host.
void* allocate_host(std::size_t nbytes);
void free_host(void* p);

}  // namespace attograd::cpu
