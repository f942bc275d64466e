// SGEMM: C = A B for float32, batched, with A and B each either row-major or
// transposed in memory (a transposed view costs nothing: the tile loader reads
// it the other way round).
//
// The classic shared-memory tiling with register blocking (as in Volkov and
// Demmel 2008, and Simon Boehm's "How to optimize a CUDA matmul"): a block of
// 256 threads computes a BM x BN tile of C. For each slice of BK along K it
// loads the A tile (BM x BK) and B tile (BK x BN) into shared memory, stored
// K-major so the inner loop reads a column of A and a row of B as float4s;
// each thread then accumulates its own TM x TN sub-tile in registers, doing
// TM * TN multiply-adds for every TM + TN values it reads. The tiles are double
// buffered: each thread fetches its share of the next tile into registers
// before computing on this one, so the loads' latency hides behind the
// products, and stores it into the other buffer after. Global loads are
// float4 where the operand is 16-byte aligned and the four elements are in
// range, scalar (zero-filled past the edge) otherwise, so any M, N, K works.
//
// Split-K: when even 64 x 64 tiles leave most SMs idle (the weight gradients
// X^T dY of a Linear: M and N the layer's widths, K = batch x tokens), K is cut
// into slices; each block computes one slice's partial product into scratch
// memory, and a second kernel adds the slices in a fixed order, so the result is
// the same on every run.
//
// cuda/matmul_tensor_core.cu has the same kernels on the tensor cores; which set
// runs is kernel_set(KernelOp::matmul) (cuda/runtime.h), asked by sgemm below.
// On the tensor cores, products whose operands allow 16-byte copies go to the
// pipelined kernel instead (cuda/matmul_tf32_pipelined.cu).
#include <algorithm>
#include <cstdint>

#include "cuda/buffer.h"
#include "cuda/gemm_common.cuh"
#include "cuda/gemm_tiles.h"
#include "cuda/runtime.h"

namespace attograd::cuda {
namespace {

using namespace gemm_detail;
using gemm_tiles::kBKFloat;

// Tile[kk][r] = X(r0 + r, k0 + kk): the tile K-major, as TileFetcher fetched it.
template <int Rows, int BK, int Threads>
__device__ __forceinline__ void store_tile(float (&tile)[BK][Rows], const Staged<kStagedLoads<Rows, BK, Threads>>& s,
                                           bool k_fastest) {
#pragma unroll
  for (int i = 0; i < kStagedLoads<Rows, BK, Threads>; ++i) {
    if (!has_load<Rows, BK, Threads, float>(i)) break;
    const auto [kk, rr] = load_at<Rows, BK, Threads, float>(i, k_fastest);
    const float4 x = s.v[i];
    if (k_fastest) {
      tile[kk + 0][rr] = x.x;
      tile[kk + 1][rr] = x.y;
      tile[kk + 2][rr] = x.z;
      tile[kk + 3][rr] = x.w;
    } else {
      *reinterpret_cast<float4*>(&tile[kk][rr]) = x;
    }
  }
}

// Which rows (columns) of the tile a thread's T values are: groups of four
// consecutive ones, the groups Tile / (T / 4) apart, so the float4 reads of
// neighbouring threads are neighbouring float4s in shared memory (no bank
// conflicts), where T consecutive rows a thread would put two threads of a
// quarter-warp on the same banks.
template <int Tile, int T>
__device__ __forceinline__ int tile_offset(int thread_coord, int i) {
  return (i / 4) * (Tile / (T / 4)) + thread_coord * 4 + i % 4;
}

// SplitK: the kernel reads g.splits and g.k_slice; otherwise each batch is one job over all of
// K. A template flag, so kernels that never split carry none of the slice arithmetic (measured
// before double buffering, it took the 128 x 128 kernel from 127 to 145 registers).
template <int BM, int BN, int BK, int TM, int TN, bool SplitK>
__global__ void __launch_bounds__((BM / TM) * (BN / TN)) sgemm_kernel(GemmArgs g) {
  constexpr int kBlockThreads = (BM / TM) * (BN / TN);
  static_assert(TM % 4 == 0 && TN % 4 == 0 && BK % 4 == 0, "tiles are read as float4");
  // Two of each tile: the block computes on one while the next is stored into the other.
  __shared__ __align__(16) float As[2][BK][BM];  // A tiles, K-major
  __shared__ __align__(16) float Bs[2][BK][BN];  // B tiles
  const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
  const std::int64_t m0 = std::int64_t(blockIdx.y) * BM, n0 = std::int64_t(blockIdx.x) * BN;
  using Acc = float[TM][TN];  // C(m0 + tile_offset<BM, TM>(ty, i), n0 + tile_offset<BN, TN>(tx, j))

  const auto store = [&](int buf, const auto& a, bool a_k_fastest, const auto& b, bool b_k_fastest) {
    store_tile<BM, BK, kBlockThreads>(As[buf], a, a_k_fastest);
    store_tile<BN, BK, kBlockThreads>(Bs[buf], b, b_k_fastest);
  };
  const auto compute = [&](Acc& acc, int buf) {
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[TM], b[TN];
      // One shared-memory float4 read per four values; the register arrays are filled by component.
#pragma unroll
      for (int i = 0; i < TM; i += 4)
        unpack4(*reinterpret_cast<const float4*>(&As[buf][kk][tile_offset<BM, TM>(ty, i)]), &a[i]);
#pragma unroll
      for (int j = 0; j < TN; j += 4)
        unpack4(*reinterpret_cast<const float4*>(&Bs[buf][kk][tile_offset<BN, TN>(tx, j)]), &b[j]);
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
  };
  const auto finish = [&](const Acc& acc, std::int64_t job) {
    float* const C = g.c + job * g.m * g.n;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const std::int64_t gm = m0 + tile_offset<BM, TM>(ty, i);
      if (gm >= g.m) continue;
#pragma unroll
      for (int j = 0; j < TN; j += 4) {
        const std::int64_t gn = n0 + tile_offset<BN, TN>(tx, j);
        float* row = C + gm * g.n;
        if (g.c_vec && gn + 4 <= g.n) {
          *reinterpret_cast<float4*>(row + gn) =
              make_float4(with_bias(g, acc[i][j], gn), with_bias(g, acc[i][j + 1], gn + 1),
                          with_bias(g, acc[i][j + 2], gn + 2), with_bias(g, acc[i][j + 3], gn + 3));
        } else {
#pragma unroll
          for (int t = 0; t < 4; ++t)
            if (gn + t < g.n) row[gn + t] = with_bias(g, acc[i][j + t], gn + t);
        }
      }
    }
  };
  gemm_jobs<BM, BN, BK, kBlockThreads, SplitK, Acc>(g, store, compute, finish, !g.a.transposed, g.b.transposed);
}

template <int BM, int BN, int BK, int TM, int TN, bool SplitK>
void launch_sgemm(const GemmArgs& g, cudaStream_t stream) {
  launch(sgemm_kernel<BM, BN, BK, TM, TN, SplitK>, gemm_grid(g, BM, BN), (BM / TM) * (BN / TN), 0, stream, g);
  CUDA_CHECK_LAUNCH();
}

constexpr GemmKernels kSimtKernels{launch_sgemm<128, 128, 8, 8, 8, false>, launch_sgemm<64, 64, 8, 4, 4, false>,
                                   launch_sgemm<64, 64, 8, 4, 4, true>, 8};

}  // namespace

void sgemm(float* c, GemmOperand a, GemmOperand b, const float* bias, std::int64_t m, std::int64_t n, std::int64_t k,
           const StridedLayout<2>& batch, cudaStream_t stream) {
  const std::int64_t batches = batch.numel;
  if (m == 0 || n == 0 || batches == 0) return;
  if (k == 0 && !bias) {  // an empty sum: C = 0 (with a bias, the kernels below store it: their loop over K is empty)
    CUDA_CHECK(cudaMemsetAsync(c, 0, sizeof(float) * batches * m * n, stream));
    return;
  }
  GemmArgs g{
      a, b, c, m, n, k, batches, batch, vector_ok(a, batch, 0), vector_ok(b, batch, 1), aligned16(c) && n % 4 == 0};
  g.k_slice = k, g.bias = bias;
  // g over `splits` slices of K, each a multiple of bk, by launch_slices(g):
  // partial products into scratch memory, then summed in slice order.
  const auto over_slices_of_k = [&](std::int64_t splits, std::int64_t bk, auto launch_slices) {
    slice_k(g, splits, bk);
    DeviceBuffer partial(sizeof(float) * g.splits * batches * m * n);
    g.c = partial.as<float>();
    g.c_vec = aligned16(g.c) && n % 4 == 0;
    g.bias = nullptr;  // added once, to the slices' sum
    launch_slices(g, stream);
    sum_slices<float>(c, partial.as<const float>(), bias, m, n, batches, g.splits, stream);
  };
  const int sms = multiprocessors();
  const bool tensor_cores = kernel_set(KernelOp::matmul) == KernelSet::tensor_core;
  // On the tensor cores, operands that allow 16-byte copies: the pipelined kernel, over slices of a long K
  // where its tiles are too few.
  if (const std::int64_t splits = tensor_cores ? sgemm_tf32_pipelined_splits(g, sms) : 0; splits > 0) {
    if (splits > 1) return over_slices_of_k(splits, kBKFloat, sgemm_tf32_pipelined);
    g.bias = nullptr;
    sgemm_tf32_pipelined(g, stream);
    // The bias after it: C as the one slice of its own sum, in place.
    if (bias) sum_slices<float>(c, c, bias, m, n, batches, 1, stream);
    return;
  }
  const GemmKernels& kernels = tensor_cores ? tensor_core_gemm_kernels() : kSimtKernels;
  // 128 x 128 tiles reuse each loaded value most; when they would leave SMs
  // idle (small or few matrices, as in attention heads), 64 x 64 tiles, and
  // when even those would, 64 x 64 tiles over slices of K.
  const std::int64_t big_tiles = ((m + 127) / 128) * ((n + 127) / 128) * batches;
  if (big_tiles >= 2 * sms) return kernels.big(g, stream);
  const std::int64_t splits = k_splits(((m + 63) / 64) * ((n + 63) / 64) * batches, k, sms);
  if (splits == 1) return kernels.small(g, stream);
  over_slices_of_k(splits, kernels.bk, kernels.small_split);
}

}  // namespace attograd::cuda
