#pragma once
// The Tensor Memory Accelerator (sm_90): one thread names a box of a tensor
// and the copy engine moves it into shared memory, in the tensor cores'
// 128-byte swizzle, zeros where the box leaves the tensor (negative
// coordinates too), and completes the transaction on an mbarrier
// (cuda/mbarrier.cuh) that the tile's readers wait for. The tensor is
// described once on the host (tile_map), and the kernel gets the description
// as a __grid_constant__ parameter.
//
// Outside sm_90a code (a build's other architectures, which never launch
// these kernels) a copy traps. The emulated build keeps its own description
// (emu::TensorMap) and makes the copies itself (tests/cuda_emulator/mbarrier.cpp).
#include <cstdint>

#include <cuda_runtime.h>
#if !defined(ATTOGRAD_CUDA_EMULATION)
#include <cuda.h>
#endif

#include "cuda/device_utils.cuh"

namespace attograd::cuda::tma {

#if defined(ATTOGRAD_CUDA_EMULATION)
using TensorMap = ::emu::TensorMap;
#else
using TensorMap = CUtensorMap;
#endif

// A bfloat16 tensor of three dims, the first contiguous (extent[0] elements a
// line), lines `stride[0]` elements apart and the third dim's planes
// `stride[1]` apart, copied in boxes of box[0] x box[1] (x 1). What TMA asks:
// a base and strides of whole 16 bytes, box[0] of 64 at most (a 128-byte line,
// the swizzle's), box[1] of 256 at most.
struct Bf16Tensor {
  const void* base;
  std::int64_t extent[3];
  std::int64_t stride[2];
  int box[2];
};

// Whether TMA can copy boxes of `t` (the bounds above); tile_map's condition.
bool tile_map_allowed(const Bf16Tensor& t);
// Its description, in the 128-byte swizzle, zeros outside.
TensorMap tile_map(const Bf16Tensor& t);

// The box whose first element is at (x, y, z) of the map's tensor, into
// shared memory at `destination` (1024-byte aligned: the swizzle is of
// addresses), its bytes completing a transaction of the mbarrier at `barrier`.
__device__ __forceinline__ void load_box(const TensorMap* map, std::uint32_t destination, std::uint32_t barrier,
                                         int x, int y, int z) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  ::emu::tma_load(*map, destination, barrier, {x, y, z});
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(destination),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(barrier)
      : "memory");
#else
  __trap();  // TMA's kernels run only where they were built for sm_90a
#endif
}

}  // namespace attograd::cuda::tma
