#pragma once
// Copies from global into shared memory that do not pass through registers
// and run while the thread goes on (cp.async, sm_80 and newer): a kernel
// issues the next tile's copies, commits them as a group, computes on the tile
// it has, and waits for the group (then a barrier, for the other threads'
// copies) before reading the next. In the emulated build (tests/cuda_emulator)
// a copy is made only when its thread waits for it, so reading too soon shows.
#include <cstdint>

#include "cuda/device_utils.cuh"

namespace attograd::cuda {

// 16 bytes into `shared` (aligned to 16): the first source_bytes (0 to 16) from
// `global` (aligned to 16), zeros after them. With 0, global is not read, but
// must still be a global address.
__device__ __forceinline__ void copy_async16(void* shared, const void* global, int source_bytes) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  if ((reinterpret_cast<std::uintptr_t>(shared) | reinterpret_cast<std::uintptr_t>(global)) % 16 != 0)
    ::emu::device_fault("cp.async: an address not aligned to 16 bytes");
  if (source_bytes < 0) ::emu::device_fault("cp.async: a negative source size");
  ::emu::async_copy(shared, global, 16, static_cast<std::size_t>(source_bytes));
#else
  const auto address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global), "r"(source_bytes));
#endif
}

// 16 bytes from `global`, or 16 zero bytes where !valid.
__device__ __forceinline__ void copy_async16(void* shared, const void* global, bool valid) {
  copy_async16(shared, global, valid ? 16 : 0);
}

// The copies issued since the last commit become one group.
__device__ __forceinline__ void commit_async_copies() {
#if defined(ATTOGRAD_CUDA_EMULATION)
  ::emu::async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most Pending of this thread's groups, the newest, are still in flight.
template <int Pending>
__device__ __forceinline__ void wait_async_copies() {
#if defined(ATTOGRAD_CUDA_EMULATION)
  ::emu::async_wait(Pending);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
#endif
}

}  // namespace attograd::cuda
