#pragma once
// How the bfloat16 products' tiles of C leave shared memory
// (cuda/matmul_bf16_pipelined.cu, cuda/matmul_bf16_wgmma.cu): each kernel
// first stores its sums, bias added and rounded once, into the staging tile
// (gemm_tiles::Swizzle over BN / 8 chunks a row); then every thread copies
// whole rows' chunks of eight to C with 16-byte stores where the row holds
// them all and C allows it, applying the MLP's epilogue (Bf16Epilogue) on the way.
#include <cstdint>

#include "cuda/gelu.cuh"
#include "cuda/gemm_common.cuh"
#include "cuda/gemm_tiles.h"
#include "cuda/mma_bf16.cuh"

namespace attograd::cuda::gemm_detail {

// Eight bfloat16 values (bits, two to a word, the lower first) each mapped
// in float32 by f (of the value, and of y's value at its place) and rounded once.
template <typename F>
__device__ __forceinline__ uint4 map_values(uint4 x, uint4 y, F f) {
  const std::uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
  std::uint32_t out[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    std::uint16_t half[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const auto value = [&](std::uint32_t word) {
        return static_cast<float>(bfloat16::from_bits(static_cast<std::uint16_t>(word >> (16 * e))));
      };
      half[e] = bfloat16(f(value(xs[w]), value(ys[w]))).bits;
    }
    out[w] = bf16_pair(half[0], half[1]);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// Up to eight values at `out`: one 16-byte store where the row holds them all
// and `whole` allows it, else those of the row's first `count`.
__device__ __forceinline__ void put_values(bfloat16* out, uint4 values, bool whole, std::int64_t count) {
  if (whole) {
    *reinterpret_cast<uint4*>(out) = values;
    return;
  }
  const std::uint32_t words[4] = {values.x, values.y, values.z, values.w};
#pragma unroll  // constant indices into words: a register each, not a stack array
  for (int e = 0; e < gemm_tiles::kChunk; ++e)
    if (e < count) out[e].bits = static_cast<std::uint16_t>(words[e / 2] >> (16 * (e % 2)));
}
__device__ __forceinline__ uint4 get_values(const bfloat16* in, bool whole, std::int64_t count) {
  if (whole) return *reinterpret_cast<const uint4*>(in);
  std::uint32_t words[4] = {0, 0, 0, 0};
#pragma unroll
  for (int e = 0; e < gemm_tiles::kChunk; ++e)
    if (e < count) words[e / 2] |= static_cast<std::uint32_t>(in[e].bits) << (16 * (e % 2));
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// The barrier of the threads that store a tile: the whole block's, or
// (warp-specialised kernels) a named barrier of theirs alone.
struct BlockMeets {
  __device__ __forceinline__ void operator()() const { __syncthreads(); }
};

// The staged BM x BN tile at (m0, n0) of job `job` into C, by Threads threads
// (this one `thread` of them), then their barrier `meet`: the staging is read
// before anything overwrites it.
template <int BM, int BN, int Threads, Bf16Epilogue Epilogue, typename Meet>
__device__ __forceinline__ void copy_out_c(const std::uint16_t* staging, const Bf16GemmArgs& g, std::int64_t job,
                                           std::int64_t m0, std::int64_t n0, int thread, Meet meet) {
  using Layout = gemm_tiles::Swizzle<BN / gemm_tiles::kChunk>;
  constexpr int kChunk = gemm_tiles::kChunk;
  const std::int64_t first = job * g.m * g.n;
  // The epilogue's operands are m x n as C, aligned as C is where it is vectorised (gemm_bf16_gelu*).
  const bool c_vec = reinterpret_cast<std::uintptr_t>(g.c) % 16 == 0 && g.n % kChunk == 0;
#pragma unroll 4
  for (int v = thread; v < BM * BN / kChunk; v += Threads) {
    const int row = v / (BN / kChunk), chunk = v % (BN / kChunk);
    const std::int64_t gm = m0 + row, gn = n0 + chunk * kChunk;
    if (gm >= g.m || gn >= g.n) continue;
    const uint4 values = *reinterpret_cast<const uint4*>(staging + Layout::at(row, chunk) * kChunk);
    const std::int64_t offset = first + gm * g.n + gn, count = g.n - gn;
    const bool whole = c_vec && count >= kChunk;
    if constexpr (Epilogue == Bf16Epilogue::gelu_grad) {
      const uint4 pre = get_values(g.pre + offset, whole, count);
      put_values(g.c + offset, map_values(values, pre, [](float x, float p) { return x * gelu_grad(p); }), whole, count);
    } else {
      put_values(g.c + offset, values, whole, count);
      if constexpr (Epilogue == Bf16Epilogue::gelu)
        put_values(g.act + offset, map_values(values, values, [](float x, float) { return gelu(x); }), whole, count);
    }
  }
  meet();
}

}  // namespace attograd::cuda::gemm_detail
