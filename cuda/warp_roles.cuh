#pragma once
// What a warp-specialised kernel (sm_90a) needs besides its mbarriers: a
// barrier among some of the block's warps (the consumers, without the
// producer), and the register file moved between warpgroups (setmaxnreg: the
// producer, which only issues copies, gives registers to the consumers, which
// hold the accumulators). Outside sm_90a code both are empty; the emulator
// has its own named barriers and no register file.
#include <cstdint>

#include "cuda/device_utils.cuh"

namespace attograd::cuda::warp_roles {

// bar.sync id, threads: the first `threads` (a multiple of 32) to arrive at
// barrier `id` (1 to 15; 0 is __syncthreads') go on together.
__device__ __forceinline__ void sync(int id, int threads) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  ::emu::named_barrier(id, threads);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

// The warpgroup's threads each keep at most Registers (a multiple of 8, 24 to 256).
template <int Registers>
__device__ __forceinline__ void release_registers() {
  static_assert(Registers % 8 == 0 && Registers >= 24 && Registers <= 256);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Registers));
#endif
}

// The warpgroup's threads each get up to Registers, as others release them.
template <int Registers>
__device__ __forceinline__ void claim_registers() {
  static_assert(Registers % 8 == 0 && Registers >= 24 && Registers <= 256);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Registers));
#endif
}

}  // namespace attograd::cuda::warp_roles
