#pragma once
// How the sm_90a bfloat16 products' tiles of C leave their accumulators
// (cuda/matmul_bf16_wgmma.cu, cuda/matmul_bf16_wgmma_tma.cu): a 128 x 256
// tile, two warpgroups of 64 x 256, each thread's 128 sums in wgmma.cuh's
// layout, stored by the tile's 256 threads (thread t of them), which meet at
// `meet` (their barrier).
#include <cstdint>

#include "cuda/gemm_bf16_epilogue.cuh"
#include "cuda/gemm_common.cuh"
#include "cuda/gemm_tiles.h"
#include "cuda/wgmma.cuh"

namespace attograd::cuda::wgmma_store {

constexpr int kBM = 128, kBN = 256;
constexpr int kThreads = 2 * wgmma::kWarpgroup;
constexpr int kAccumulators = kBN / 2;  // a thread's of its warpgroup's 64 x 256

// Row and column of thread t's accumulator 4 j + v (wgmma.cuh's layout) in the tile.
struct AccumulatorAt {
  int row0, q;
  __device__ __forceinline__ explicit AccumulatorAt(int t)
      : row0(t / wgmma::kWarpgroup * 64 + t % wgmma::kWarpgroup / 32 * 16 + t % 32 / 4), q(t % 4) {}
  __device__ __forceinline__ int row(int half) const { return row0 + 8 * half; }
  __device__ __forceinline__ int col(int j) const { return 8 * j + 2 * q; }
};

// Thread t's sums into a staged tile of C (its rows AccumulatorAt(t)'s), bias
// added and rounded once, two neighbouring columns a 4-byte word.
__device__ __forceinline__ void stage_sums(const float (&acc)[kAccumulators], std::uint16_t* staging,
                                           const gemm_detail::Bf16GemmArgs& g, std::int64_t n0, int t) {
  using Layout = gemm_tiles::Swizzle<kBN / gemm_tiles::kChunk>;
  constexpr int kChunk = gemm_tiles::kChunk;
  const AccumulatorAt at(opaque(t));  // not hoisted into the main loop's registers
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j) {
    const int col = at.col(j);
    float bias[2] = {0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < 2; ++c)
      if (g.bias && n0 + col + c < g.n) bias[c] = static_cast<float>(g.bias[n0 + col + c]);
#pragma unroll
    for (int half = 0; half < 2; ++half)
      *reinterpret_cast<std::uint32_t*>(staging + Layout::at(at.row(half), j) * kChunk + col % kChunk) =
          bf16_pair(bfloat16(acc[4 * j + 2 * half] + bias[0]).bits, bfloat16(acc[4 * j + 2 * half + 1] + bias[1]).bits);
  }
}

// Thread t's sums into C's staged tile, then out to C, with the MLP's GELU
// epilogue on the way where Epilogue asks.
template <gemm_detail::Bf16Epilogue Epilogue, typename Meet>
__device__ __forceinline__ void store_c(const float (&acc)[kAccumulators], std::uint16_t* staging,
                                        const gemm_detail::Bf16GemmArgs& g, std::int64_t job, std::int64_t m0,
                                        std::int64_t n0, int t, Meet meet) {
  stage_sums(acc, staging, g, n0, t);
  meet();
  gemm_detail::copy_out_c<kBM, kBN, kThreads, Epilogue>(staging, g, job, m0, n0, t, meet);
}

// The same through a staged tile of half the rows (kHalfStagingBytes): the
// first warpgroup's 64 rows, then the second's, each copied out by all the
// tile's threads. For a kernel whose stages stay in use while C leaves.
constexpr int kHalfStagingBytes = 64 * kBN * 2;
template <gemm_detail::Bf16Epilogue Epilogue, typename Meet>
__device__ __forceinline__ void store_c_by_halves(const float (&acc)[kAccumulators], std::uint16_t* staging,
                                                  const gemm_detail::Bf16GemmArgs& g, std::int64_t job,
                                                  std::int64_t m0, std::int64_t n0, int t, Meet meet) {
  for (int half = 0; half < 2; ++half) {
    if (t / wgmma::kWarpgroup == half) stage_sums(acc, staging, g, n0, t % wgmma::kWarpgroup);
    meet();
    gemm_detail::copy_out_c<64, kBN, kThreads, Epilogue>(staging, g, job, m0 + 64 * half, n0, t, meet);
  }
}

// Split-K's partial product of the job, as it is: two neighbouring float32 values a row and j.
__device__ __forceinline__ void store_partial(const float (&acc)[kAccumulators], const gemm_detail::Bf16GemmArgs& g,
                                              std::int64_t job, std::int64_t m0, std::int64_t n0, int t) {
  float* const partial = g.partial + job * g.m * g.n;
  const bool pairs = g.n % 2 == 0;
  const AccumulatorAt at(opaque(t));
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const std::int64_t gm = m0 + at.row(half);
    if (gm >= g.m) continue;
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
      const std::int64_t gn = n0 + at.col(j);
      float* out = partial + gm * g.n + gn;
      if (pairs && gn + 1 < g.n) {
        *reinterpret_cast<float2*>(out) = make_float2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
      } else {
        if (gn < g.n) out[0] = acc[4 * j + 2 * half];
        if (gn + 1 < g.n) out[1] = acc[4 * j + 2 * half + 1];
      }
    }
  }
}

}  // namespace attograd::cuda::wgmma_store
