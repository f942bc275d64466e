#pragma once
// Host memory for tensors and the CPU kernels' scratch. Every block starts on a
// cache line (vector loads and AMX tile rows want 64 bytes); a block of 2 MiB
// or more starts on a 2 MiB boundary and asks Linux for transparent huge pages
// (madvise, Debian's default THP mode), so that a kernel reading a large
// operand along its columns (an AMX tile's 16 rows, each on its own 4 KiB page
// when rows are 4 KiB apart) misses the TLB once per 2 MiB, not once per row.
//
// Those large blocks are mapped from the system directly and unmapped when
// freed, so that memory a program gives back leaves its resident set at once:
// glibc serves blocks under its (adaptive, up to 32 MiB) mmap threshold from
// its heap, where a freed block between live ones stays resident. Under
// AddressSanitizer every block comes from the system allocator instead, whose
// bounds ASan checks.
#include <cstddef>

namespace attograd::cpu {

inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// nbytes (0 counts as 1) of uninitialised memory; null when out of memory.
// Freed by free_host with the same nbytes.
void* allocate_host(std::size_t nbytes);
void free_host(void* p, std::size_t nbytes);
// Whether blocks of 2 MiB or more are mapped and unmapped (false under ASan, or off Linux).
bool large_blocks_mapped();

}  // namespace attograd::cpu
