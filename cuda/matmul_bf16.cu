// The bfloat16 matrix product on the tensor cores: C = A B (+ bias), each
// warp's products mma.sync m16n8k16 on bfloat16 operands with float32 sums
// (cuda/mma_bf16.cuh), each sum rounded once to bfloat16 as it is stored.
//
// A block computes a BM x BN tile of C with warps of WM x WN each: WM / 16
// fragments of A (16 rows) against WN / 8 of B (8 columns) per step of 16
// along K. A and B^T stream through shared memory in tiles of kBK = 32 along
// K, each row of a tile its k values side by side, so a lane's fragment
// register (two consecutive k of one row, mma_bf16.cuh) is one aligned 32-bit
// read; the rows are padded to 40 values (80 bytes, 20 banks), so the eight
// rows a warp reads at once start on eight different groups of four banks.
// The tiles are double buffered in the SGEMMs' job loop (gemm_jobs,
// cuda/gemm_common.cuh): each thread fetches its share of the next pair into
// registers (8 values, 16 bytes, at a time) while the warps compute on this one.
//
// Operands come in either layout: where a row's k values lie side by side in
// memory (A row-major, B transposed) a fetch is eight k of one row, stored as
// one 16-byte write; otherwise eight rows of one k, stored value by value.
//
// Split-K as the SGEMMs: when even 64 x 64 tiles leave most SMs idle (a
// Linear's weight gradient, K = batch x tokens), slices of K go to their own
// blocks, whose float32 partial products a second kernel adds in slice order,
// adding the bias and rounding once. Not here yet: a measured choice of tile
// sizes, ldmatrix, cp.async. On an H200 (2026-12-04) the 4096 product ran at
// 15% of cuBLAS's bfloat16 GEMM (docs/cuda.md).
#include <cstdint>

#include "cuda/buffer.h"
#include "cuda/gemm_common.cuh"
#include "cuda/mma_bf16.cuh"

namespace attograd::cuda {
namespace {

using namespace gemm_detail;

constexpr int kBK = 32;              // K per shared-memory tile: two mma steps
constexpr int kRowStride = kBK + 8;  // values per tile row, padded (see above)
constexpr int kChunk = kPerLoad<std::uint16_t>;  // values per fetch: 8, 16 bytes

template <int Rows, int Threads>
using Fetched = Staged<kStagedLoads<Rows, kBK, Threads, std::uint16_t>, std::uint16_t>;

// tile[r * kRowStride + kk] = X(r0 + r, k0 + kk), from fetch_tile's share.
//
// Where k runs fastest in memory a load is 8 k of one row, stored as it is. Where the rows do,
// a thread's loads are pairs (gemm_common.cuh's transposed_load_at): 8 rows at k = 2w and at
// 2w + 1, stored as 8 words of two k, one a row. A half-warp's 16 threads write the 16 words of
// one row each time; the other half's rows lie 8 further on, 8 * 20 words (0 mod 32 banks) away,
// so it writes its 8 rows from the fifth on, 80 words (16 banks) from the first half's: all 32
// banks, where one value at a time had 16 threads on one bank (the first GPU window: this
// operand layout ran the 4096 product at 10% of cuBLAS's bfloat16 GEMM, 15% with this).
template <int Rows, int Threads>
__device__ __forceinline__ void store(std::uint16_t* tile, const Fetched<Rows, Threads>& f, bool k_fastest) {
  constexpr int kLoads = kStagedLoads<Rows, kBK, Threads, std::uint16_t>;
  if (k_fastest) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int v = threadIdx.x + i * Threads;
      const int rr = v / (kBK / kChunk), kk = (v % (kBK / kChunk)) * kChunk;
      *reinterpret_cast<uint4*>(tile + rr * kRowStride + kk) = f.v[i];
    }
    return;
  }
  const bool second_half = threadIdx.x % kWarp >= kWarp / 2;
#pragma unroll
  for (int i = 0; i < kLoads; i += 2) {
    const auto [kk, rr] = transposed_load_at<Rows, kBK, Threads, std::uint16_t>(i);
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      const int s = (t + kChunk / 2) % kChunk;  // the second half's row at step t
      const std::uint32_t word = second_half ? bf16_pair(bf16_at(f.v[i], s), bf16_at(f.v[i + 1], s))
                                             : bf16_pair(bf16_at(f.v[i], t), bf16_at(f.v[i + 1], t));
      const int row = rr + (second_half ? s : t);
      *reinterpret_cast<std::uint32_t*>(tile + row * kRowStride + kk) = word;
    }
  }
}

// SplitK: the job writes its float32 partial product to g.partial; otherwise
// C rounded to bfloat16, with the bias.
template <int BM, int BN, int WM, int WN, bool SplitK>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * kWarp) gemm_bf16_kernel(Bf16GemmArgs g) {
  constexpr int kWarpsN = BN / WN, kBlockThreads = kWarp * (BM / WM) * kWarpsN;
  constexpr int FM = WM / 16, FN = WN / 8;  // a warp's A and B fragments per mma step
  // Two of each tile: the warps compute on one while the next is stored into the other.
  __shared__ __align__(16) std::uint16_t a_tiles[2][BM * kRowStride];
  __shared__ __align__(16) std::uint16_t b_tiles[2][BN * kRowStride];  // B^T: row n holds B(k0.., n)
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  const int g_lane = lane / 4, t_lane = lane % 4;
  const std::int64_t m0 = std::int64_t(blockIdx.y) * BM, n0 = std::int64_t(blockIdx.x) * BN;
  using Acc = float[FM][FN][4];  // mma_bf16.cuh's C fragments of the warp's 16 x 8 tiles

  const auto store_tiles = [&](int buf, const auto& a, bool a_k_fastest, const auto& b, bool b_k_fastest) {
    store<BM, kBlockThreads>(a_tiles[buf], a, a_k_fastest);
    store<BN, kBlockThreads>(b_tiles[buf], b, b_k_fastest);
  };
  const auto compute = [&](Acc& acc, int buf) {
#pragma unroll
    for (int step = 0; step < kBK / 16; ++step) {
      std::uint32_t b_frag[FN][2];
#pragma unroll
      for (int j = 0; j < FN; ++j)
        load_b_fragment(b_frag[j], b_tiles[buf] + (warp_n * WN + j * 8) * kRowStride, kRowStride, step * 16, g_lane,
                        t_lane);
#pragma unroll
      for (int i = 0; i < FM; ++i) {
        std::uint32_t a_frag[4];
        load_a_fragment(a_frag, a_tiles[buf] + (warp_m * WM + i * 16) * kRowStride, kRowStride, step * 16, g_lane,
                        t_lane);
#pragma unroll
        for (int j = 0; j < FN; ++j) mma_bf16(acc[i][j], a_frag, b_frag[j]);
      }
    }
  };
  // Lane (g, t) holds rows g and g + 8 of each 16 x 8 tile, columns 2t and 2t + 1.
  const auto finish = [&](const Acc& acc, std::int64_t job) {
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const std::int64_t gm = m0 + warp_m * WM + i * 16 + half * 8 + g_lane;
        if (gm >= g.m) continue;
#pragma unroll
        for (int j = 0; j < FN; ++j)
#pragma unroll
          for (int col = 0; col < 2; ++col) {
            const std::int64_t gn = n0 + warp_n * WN + j * 8 + 2 * t_lane + col;
            if (gn >= g.n) continue;
            const float sum = acc[i][j][2 * half + col];
            const std::int64_t at = job * g.m * g.n + gm * g.n + gn;
            if (SplitK)
              g.partial[at] = sum;
            else
              g.c[at] = bfloat16(g.bias ? sum + static_cast<float>(g.bias[gn]) : sum);
          }
      }
  };
  gemm_jobs<BM, BN, kBK, kBlockThreads, SplitK, Acc>(g, store_tiles, compute, finish);
}

template <int BM, int BN, int WM, int WN, bool SplitK>
void launch_gemm_bf16(const Bf16GemmArgs& g, cudaStream_t stream) {
  launch(gemm_bf16_kernel<BM, BN, WM, WN, SplitK>, gemm_grid(g, BM, BN), kWarp * (BM / WM) * (BN / WN), 0, stream, g);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void gemm_bf16(bfloat16* c, Bf16GemmOperand a, Bf16GemmOperand b, const bfloat16* bias, std::int64_t m,
               std::int64_t n, std::int64_t k, const StridedLayout<2>& batch, cudaStream_t stream) {
  const std::int64_t batches = batch.numel;
  if (m == 0 || n == 0 || batches == 0) return;
  // K = 0 needs nothing apart: the loop over K is empty and C is the bias, or zero.
  Bf16GemmArgs g{a, b, c, bias, m, n, k, batches, batch, vector_ok(a, batch, 0), vector_ok(b, batch, 1)};
  g.k_slice = k;
  // 128 x 128 tiles of 8 warps (64 x 32 each) reuse each loaded value most;
  // where they would leave SMs idle, 64 x 64 tiles of 4 warps (32 x 32 each),
  // and where even those would, 64 x 64 tiles over slices of K.
  const int sms = multiprocessors();
  const std::int64_t big_tiles = ((m + 127) / 128) * ((n + 127) / 128) * batches;
  if (big_tiles >= 2 * sms) return launch_gemm_bf16<128, 128, 64, 32, false>(g, stream);
  const std::int64_t splits = k_splits(((m + 63) / 64) * ((n + 63) / 64) * batches, k, sms);
  if (splits == 1) return launch_gemm_bf16<64, 64, 32, 32, false>(g, stream);

  slice_k(g, splits, kBK);
  DeviceBuffer partial(sizeof(float) * g.splits * batches * m * n);
  g.partial = partial.as<float>();
  launch_gemm_bf16<64, 64, 32, 32, true>(g, stream);
  sum_slices<bfloat16>(c, partial.as<const float>(), bias, m, n, batches, g.splits, stream);
}

}  // namespace attograd::cuda
