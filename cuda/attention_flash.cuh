#pragma once
// What the attention kernels in FlashAttention-2's shape share (the bfloat16
// forward and backward, cuda/attention_bf16_flash.cu and
// attention_bf16_flash_backward.cu; the float32 ones, attention_tf32_flash.cu
// and attention_tf32_flash_backward.cu):
// exp2 in one instruction, a word of a Philox draw, a lane's ldmatrix offsets
// along a line of the head size, copying a tile of rows into a swizzled tile
// (cuda/gemm_tiles.h) by cp.async, a 16-byte chunk a copy, and choosing the
// kernel made for a problem (and whether a masked one's sweep is causal).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "base/philox.h"
#include "cuda/async_copy.cuh"
#include "cuda/attention_common.cuh"
#include "cuda/gemm_tiles.h"

namespace attograd::cuda::attention_detail::flash {

// 2^x, one MUFU.EX2: 2^-inf is 0, and its relative error (2^-22) is far below bfloat16's.
__device__ __forceinline__ float exp2_fast(float x) {
#if defined(__CUDA_ARCH__) && !defined(ATTOGRAD_CUDA_EMULATION)
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
#else
  return std::exp2(x);
#endif
}

// Word k (0 to 3) of four (a draw's), chosen by selects on k's two bits:
// indexing the array by a run-time k would put it in local memory, and
// comparing k with each value made branches around the selects.
__device__ __forceinline__ std::uint32_t word_at(const std::uint32_t (&words)[4], int k) {
  const std::uint32_t low = k & 1 ? words[1] : words[0], high = k & 1 ? words[3] : words[2];
  return k & 2 ? high : low;
}

// A lane's ldmatrix offsets into a tile whose lines hold the head size, one for
// each 16 of D (a step of a product summing over D, or a block of 16 of its
// columns). The swizzle permutes chunks within each run of 8 (128 bytes), so
// offsets 4 apart are 128 bytes apart: only the first four are held, which at
// D = 128 saves four registers an array.
template <int D>
struct LaneAddresses {
  static constexpr int kHeld = D / 16 < 4 ? D / 16 : 4;
  int at[kHeld];
  template <typename Offset>  // Offset: int(int i), the offset for the i-th 16 of D
  __device__ __forceinline__ explicit LaneAddresses(Offset offset) {
#pragma unroll
    for (int i = 0; i < kHeld; ++i) at[i] = offset(i);
  }
  __device__ __forceinline__ int operator[](int i) const { return at[i % kHeld] + i / kHeld * 128; }
};

// A tile of rows of (b, h) into shared memory by the block's Threads threads,
// a line a row, this thread's copy i lying i * Threads chunks after copy 0's
// (Threads / Tile::kLineChunks rows further on). `first` points at copy 0's
// source row; rows at and past `valid` read nothing, from `fallback`, an
// address inside the tensor.
template <typename Tile, int Threads, typename T>
__device__ __forceinline__ void copy_rows(std::uint16_t* tile, int destination, const T* first,
                                          std::int64_t row_step16, int valid, const T* fallback) {
  static_assert(Tile::template kCopiesEvenlyApart<Threads>, "a thread's copies lie a whole number of swizzle periods apart");
  constexpr int kCopies = Tile::kChunks / Threads, kRowsApart = Threads / Tile::kLineChunks;
  const int line0 = threadIdx.x / Tile::kLineChunks;
  const T* source = first;
#pragma unroll
  for (int i = 0; i < kCopies; ++i) {
    const bool inside = line0 + i * kRowsApart < valid;
    copy_async16(gemm_tiles::byte_offset(tile, destination + i * Threads * 16), inside ? source : fallback,
                 inside ? 16 : 0);
    source += row_step16;
  }
}

// The kernel a family of them makes for the problem: Family::kernel<D, Causal,
// HasMask, Dropout>() at head size D (32, 64 or 128), one for each of causal,
// masked and dropout, so that the common one has no code for the others. A
// masked kernel tests every score with the problem's hidden(), causality
// among its tests, so it takes causality at run time (kernel<D, false, true,
// Dropout> with p.causal: the sweeps' ends, sweep_is_causal) and no causal
// twin is made.
template <typename Family, int D>
typename Family::Kernel kernel_for(const AttentionProblem& p) {
  const auto made = [&](auto causal, auto mask) {
    constexpr bool kCausal = decltype(causal)::value, kMask = decltype(mask)::value;
    return p.dropout() ? Family::template kernel<D, kCausal, kMask, true>()
                       : Family::template kernel<D, kCausal, kMask, false>();
  };
  if (p.mask != nullptr) return made(std::false_type{}, std::true_type{});
  return p.causal ? made(std::true_type{}, std::false_type{}) : made(std::false_type{}, std::false_type{});
}

template <typename Family>
typename Family::Kernel kernel_for(const AttentionProblem& p) {
  return p.D == 32 ? kernel_for<Family, 32>(p) : p.D == 64 ? kernel_for<Family, 64>(p) : kernel_for<Family, 128>(p);
}

// Whether a kernel's sweep skips what causality hides: Causal for the kernels
// without a mask, the problem's flag for the masked one (kernel_for).
template <bool Causal, bool HasMask>
__device__ __forceinline__ bool sweep_is_causal(const AttentionProblem& p) {
  static_assert(!(Causal && HasMask), "a masked kernel takes causality at run time");
  return HasMask ? p.causal : Causal;
}

}  // namespace attograd::cuda::attention_detail::flash
