#pragma once
// Scratch buffers of the CPU kernels, from host_memory.h: each starts on a
// cache line so that their rows (whole vectors long) do too, a vector load or
// store across two lines costing two (std::vector's allocator only promises
// 16 bytes: with its operands 16 bytes off a line, a tile product of the
// fused attention in L1 ran markedly slower; AMX tile loads want
// 64 bytes too), and the large ones on huge pages.
#include <cstddef>
#include <new>
#include <vector>

#include "cpu/host_memory.h"

namespace attograd::cpu {

template <typename T>
struct HostAllocator {
  using value_type = T;
  HostAllocator() = default;
  template <typename U>
  HostAllocator(const HostAllocator<U>&) {}
  T* allocate(std::size_t n) {
    void* p = allocate_host(n * sizeof(T));
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) { free_host(p, n * sizeof(T)); }
  friend bool operator==(const HostAllocator&, const HostAllocator&) { return true; }
};
template <typename T>
using Scratch = std::vector<T, HostAllocator<T>>;

}  // namespace attograd::cpu
