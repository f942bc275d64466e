#pragma once
// The fused attention's tiles: how many queries and keys one holds, and the
// cache-line-aligned scratch buffers threads keep them in. Part of the one
// translation unit tensor/cpu/attention/attention.cpp (see there).
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace attograd::cpu::attention_detail {

constexpr std::int64_t kBlockQ = 64;  // queries per tile; a multiple of every vector width and micro-tile height
constexpr std::int64_t kBlockK = 64;  // keys per tile; a multiple of every micro-tile height
// A diagonal offset no index reaches: "no causal limit" in the tile loops below.
constexpr std::int64_t kNoDiagonal = std::int64_t(1) << 40;

constexpr std::int64_t round_up(std::int64_t n, std::int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Scratch buffers start on a cache line, so that their rows (whole vectors
// long) do too: a vector load or store across two lines costs two, and
// std::vector's allocator only promises 16 bytes. With its operands 16 bytes
// off a line, one 64 x 64 x 64 tile product in L1 ran 10-35% slower.
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

}  // namespace attograd::cpu::attention_detail
