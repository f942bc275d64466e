#pragma once
// Sums that several blocks add into one place of global memory in a fixed
// order, so that a run gives the same bits every time (unordered atomics would
// not): each place has a counter of the turns taken, and the block whose turn
// is n waits until the counter reads n, adds its part, and passes the turn on.
// A warp takes its turn as a whole: lane 0 waits and passes, and the warp's
// barrier orders the other lanes' reads after the wait and their writes before
// the pass. While a block waits, the holders of the earlier turns must make
// progress: they have lower block indices, and a GPU starts blocks in the
// order of their index, so they are running or done (FlashAttention-3's
// deterministic backward relies on the same). The sums are read and written
// in L2 (ld.cg, st.cg): an SM's L1 does not see another SM's writes.
//
// In the emulated build blocks run one after another in the order of their
// index, so a turn that the counter does not already show never comes: the
// wait is a check, and its failure a fault naming the block.
#include "cuda/device_utils.cuh"

namespace attograd::cuda {

__device__ __forceinline__ void wait_for_turn(const int* counter, int turn) {
  if (threadIdx.x % kWarp == 0) {
#if defined(ATTOGRAD_CUDA_EMULATION)
    if (*counter != turn) ::emu::device_fault("ordered sum: waiting for a turn that the blocks before this one did not pass");
#else
    for (;;) {
      int seen;
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
      if (seen == turn) break;
      __nanosleep(64);
    }
#endif
  }
  __syncwarp();
}

// After the warp's writes of its part: the counter moves to `next`.
__device__ __forceinline__ void pass_turn(int* counter, int next) {
#if !defined(ATTOGRAD_CUDA_EMULATION)
  __threadfence();
#endif
  __syncwarp();
  if (threadIdx.x % kWarp == 0) {
#if defined(ATTOGRAD_CUDA_EMULATION)
    *counter = next;
#else
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(counter), "r"(next) : "memory");
#endif
  }
}

// A part of a sum, read and written in L2.
__device__ __forceinline__ float2 load_sum(const float2* at) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  return *at;
#else
  return __ldcg(at);
#endif
}
__device__ __forceinline__ void store_sum(float2* at, float2 value) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  *at = value;
#else
  __stcg(at, value);
#endif
}

}  // namespace attograd::cuda
