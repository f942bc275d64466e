#pragma once
// sm_90's barriers in shared memory (mbarrier): a phase completes when the
// barrier's count of threads has arrived and every byte its arrivals said to
// expect has come (TMA copies, cuda/tma.cuh, complete those transactions).
// Producer and consumer warps hand tiles over through them without stopping
// the whole block: a consumer waits for a stage's "full" barrier, a producer
// for its "empty" one. A wait names the parity of the phase it waits for; a
// new barrier's phase of parity 1 counts as complete, so a producer's first
// wait for each stage returns at once.
//
// Outside sm_90a code (a build's other architectures, which never launch the
// kernels that use them) they are empty and a wait traps. The emulated build
// keeps each barrier's state itself (tests/cuda_emulator/mbarrier.cpp).
#include <cstdint>

#include "cuda/device_utils.cuh"

namespace attograd::cuda::mbarrier {

// `count` arrivals complete a phase. One thread initialises; fence_init and a
// barrier of the block follow before any other thread or copy uses it.
__device__ __forceinline__ void init(std::uint32_t barrier, int count) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  ::emu::mbarrier_init(barrier, count);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(count) : "memory");
#endif
}

// Makes the initialised barriers visible to the copy engine (the async proxy).
__device__ __forceinline__ void fence_init() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void arrive(std::uint32_t barrier) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  ::emu::mbarrier_arrive(barrier, 0);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
#endif
}

// Arrives, and adds `bytes` to the transactions the phase waits for.
__device__ __forceinline__ void arrive_expect_bytes(std::uint32_t barrier, std::uint32_t bytes) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  ::emu::mbarrier_arrive(barrier, bytes);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
#endif
}

// Returns once the barrier's phase of this parity has completed.
__device__ __forceinline__ void wait(std::uint32_t barrier, int parity) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  ::emu::mbarrier_wait(barrier, parity);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  std::uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(barrier), "r"(parity)
        : "memory");
  } while (!done);
#else
  __trap();  // mbarriers' kernels run only where they were built for sm_90a
#endif
}

}  // namespace attograd::cuda::mbarrier
