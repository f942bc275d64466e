#pragma once
// Scratch buffers of the CPU kernels, each starting on a cache line so that
// their rows (whole vectors long) do too: a vector load or store across two
// lines costs two, and std::vector's allocator only promises 16 bytes. With
// its operands 16 bytes off a line, one 64 x 64 x 64 tile product of the fused
// attention in L1 ran 10-35% slower; AMX tile loads want 64 bytes too.
#include <cstddef>
#include <new>
#include <vector>

namespace attograd::cpu {

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlignment)); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, kAlignment); }
  friend bool operator==(const CacheLineAllocator&, const CacheLineAllocator&) { return true; }
};
template <typename T>
using Scratch = std::vector<T, CacheLineAllocator<T>>;

}  // namespace attograd::cpu
