// The bfloat16 matrix product on the tensor cores: C = A B (+ bias), each
// warp's products mma.sync m16n8k16 on bfloat16 operands with float32 sums
// (cuda/mma_bf16.cuh), each sum rounded once to bfloat16 as it is stored.
//
// A block computes a BM x BN tile of C with warps of WM x WN each: WM / 16
// fragments of A (16 rows) against WN / 8 of B (8 columns) per step of 16
// along K. A and B^T stream through shared memory in tiles of kBK = 32 along
// K, each tile stored as its operand lies in memory: rows of k where k runs
// fastest (A row-major, B transposed), rows of the operand's rows where those
// do. Either way a fetch is eight neighbouring values, one 16-byte load and
// one 16-byte store, and each fragment comes from ldmatrix (load_matrices),
// plain or transposing: one instruction for an A fragment or two B fragments,
// where 32-bit reads took four, and no value is moved one at a time.
// The tiles are double buffered in the SGEMMs' job loop (gemm_jobs,
// cuda/gemm_common.cuh): each thread fetches its share of the next pair into
// registers while the warps compute on this one.
//
// Split-K as the SGEMMs: when even 64 x 64 tiles leave most SMs idle (a
// Linear's weight gradient, K = batch x tokens), slices of K go to their own
// blocks, whose float32 partial products a second kernel adds in slice order,
// adding the bias and rounding once. Large products whose operands allow
// 16-byte copies go to the pipelined kernel instead
// (cuda/matmul_bf16_pipelined.cu: cp.async stages, swizzled tiles), or on
// sm_90a, where chosen, to Hopper's warpgroup products
// (cuda/matmul_bf16_wgmma.cu); these kernels take the rest: offset or oddly
// strided operands, and skinny shapes.
#include <algorithm>
#include <cstdint>

#include "cuda/buffer.h"
#include "cuda/gemm_common.cuh"
#include "cuda/gemm_tiles.h"
#include "cuda/mma_bf16.cuh"
#include "cuda/runtime.h"

namespace attograd::cuda {
namespace {

using namespace gemm_detail;

constexpr int kBK = 32;  // K per shared-memory tile: two mma steps
constexpr int kWgmmaTileK = gemm_tiles::WgmmaTile<128, true>::kK;  // the sm_90a kernels'
// Values of padding after each stored row of a tile: rows 80 bytes apart (40
// values of k) or 16 more than a multiple of 128 (Rows + 8 values) put the
// eight 16-byte rows an ldmatrix reads at once on eight different groups of
// four banks.
constexpr int kPad = 8;

template <int Rows, int Threads>
using Fetched = Staged<kStagedLoads<Rows, kBK, Threads, std::uint16_t>, std::uint16_t>;

// Where element (r, kk) of a Rows x kBK tile is stored: at r * row + kk * k.
struct TileSteps {
  int row, k;
};
template <int Rows>
__device__ __forceinline__ TileSteps tile_steps(bool k_fastest) {
  return k_fastest ? TileSteps{kBK + kPad, 1} : TileSteps{1, Rows + kPad};
}
template <int Rows>
constexpr int kTileValues = std::max(Rows * (kBK + kPad), kBK * (Rows + kPad));

// This thread's share of a tile (TileFetcher's), each load as one 16-byte store.
template <int Rows, int Threads>
__device__ __forceinline__ void store(std::uint16_t* tile, const Fetched<Rows, Threads>& f, bool k_fastest) {
  const TileSteps at = tile_steps<Rows>(k_fastest);
#pragma unroll
  for (int i = 0; i < kStagedLoads<Rows, kBK, Threads, std::uint16_t>; ++i) {
    if (!has_load<Rows, kBK, Threads, std::uint16_t>(i)) break;
    const auto [kk, rr] = load_at<Rows, kBK, Threads, std::uint16_t>(i, k_fastest);
    *reinterpret_cast<uint4*>(tile + rr * at.row + kk * at.k) = f.v[i];
  }
}

// The row this lane gives load_matrices for each 16 x 16 block of a tile
// (mma_bf16.cuh): A's fragment, or B's two, with k along the stored rows or
// across them.
__device__ __forceinline__ int a_fragment_row(TileSteps at, bool k_fastest) {
  return k_fastest ? quarters_down_row(at.row) : quarters_across_row(at.k);
}
__device__ __forceinline__ int b_fragments_row(TileSteps at, bool k_fastest) {
  return k_fastest ? quarters_across_row(at.row) : quarters_down_row(at.k);
}

__device__ __forceinline__ void load_fragments(std::uint32_t (&r)[4], const std::uint16_t* row, bool k_fastest) {
  if (k_fastest)
    load_matrices<false>(r, row);
  else
    load_matrices<true>(r, row);
}

// SplitK: the job writes its float32 partial product to g.partial; otherwise
// C rounded to bfloat16, with the bias. A kernel for each pair of operand
// layouts (ATransposed, BTransposed: g's own), so that its stores and fragment
// loads are fixed instructions, not both of each with a predicate choosing.
//
// Two blocks of the 128 x 128 kernel fit an SM (at most 128 registers a
// thread; ptxas, sm_90: 124 to 128, no spill in three of the four layouts and
// one 8-byte reload a tile in the fourth, where one block alone used up to
// 174): while one block waits at its barrier or on its loads, the other's
// products keep the tensor cores busy. Unmeasured on a GPU yet.
template <int BM, int BN, int WM, int WN, bool SplitK, bool ATransposed, bool BTransposed>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * kWarp, BM == 128 ? 2 : 1) gemm_bf16_kernel(Bf16GemmArgs g) {
  constexpr int kWarpsN = BN / WN, kBlockThreads = kWarp * (BM / WM) * kWarpsN;
  constexpr int FM = WM / 16, FN = WN / 8;  // a warp's A and B fragments per mma step
  static_assert(FN % 2 == 0, "B's fragments are loaded in pairs");
  // Two of each tile: the warps compute on one while the next is stored into the other.
  __shared__ __align__(16) std::uint16_t a_tiles[2][kTileValues<BM>];
  __shared__ __align__(16) std::uint16_t b_tiles[2][kTileValues<BN>];  // B^T: row n holds B(k0.., n)
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  const int g_lane = lane / 4, t_lane = lane % 4;
  const std::int64_t m0 = std::int64_t(blockIdx.y) * BM, n0 = std::int64_t(blockIdx.x) * BN;
  using Acc = float[FM][FN][4];  // mma_bf16.cuh's C fragments of the warp's 16 x 8 tiles
  // As gemm_jobs reads the operands: A's rows are M, B^T's are N.
  constexpr bool a_k_fastest = !ATransposed, b_k_fastest = BTransposed;
  const TileSteps a_at = tile_steps<BM>(a_k_fastest), b_at = tile_steps<BN>(b_k_fastest);
  // This warp's part of each tile, and this lane's row within each block it loads.
  const int a_first = warp_m * WM * a_at.row + a_fragment_row(a_at, a_k_fastest);
  const int b_first = warp_n * WN * b_at.row + b_fragments_row(b_at, b_k_fastest);

  const auto store_tiles = [&](int buf, const auto& a, bool /*a_k_fastest*/, const auto& b, bool /*b_k_fastest*/) {
    store<BM, kBlockThreads>(a_tiles[buf], a, a_k_fastest);
    store<BN, kBlockThreads>(b_tiles[buf], b, b_k_fastest);
  };
  const auto compute = [&](Acc& acc, int buf) {
#pragma unroll
    for (int step = 0; step < kBK / 16; ++step) {
      std::uint32_t b_frag[FN][2];
#pragma unroll
      for (int j = 0; j < FN; j += 2) {
        std::uint32_t r[4];
        load_fragments(r, b_tiles[buf] + b_first + j * 8 * b_at.row + step * 16 * b_at.k, b_k_fastest);
        b_frag[j][0] = r[0], b_frag[j][1] = r[1], b_frag[j + 1][0] = r[2], b_frag[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < FM; ++i) {
        std::uint32_t a_frag[4];
        load_fragments(a_frag, a_tiles[buf] + a_first + i * 16 * a_at.row + step * 16 * a_at.k, a_k_fastest);
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
  gemm_jobs<BM, BN, kBK, kBlockThreads, SplitK, Acc>(g, store_tiles, compute, finish, a_k_fastest, b_k_fastest);
}

// Whether the sm_90a kernel takes g, which the pipelined kernel would take:
// chosen, and an sm_90a build on an sm_90 GPU.
bool wgmma_runs(const Bf16GemmArgs& g) {
  if (!gemm_bf16_wgmma_takes(g) || !wgmma_products_chosen()) return false;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return wgmma_kernels_run(device);
}

// g, which the pipelined kernel takes, on the sm_90a kernel where that runs, else on the pipelined one.
void launch_pipelined_product(const Bf16GemmArgs& g, cudaStream_t stream) {
  if (wgmma_runs(g)) return gemm_bf16_wgmma(g, stream);
  if (g.epilogue == Bf16Epilogue::none) return gemm_bf16_pipelined(g, stream);
  gemm_bf16_pipelined_epilogue(g, stream);
}

template <int BM, int BN, int WM, int WN, bool SplitK>
void launch_gemm_bf16(const Bf16GemmArgs& g, cudaStream_t stream) {
  const auto kernel = g.a.transposed ? (g.b.transposed ? gemm_bf16_kernel<BM, BN, WM, WN, SplitK, true, true>
                                                       : gemm_bf16_kernel<BM, BN, WM, WN, SplitK, true, false>)
                                     : (g.b.transposed ? gemm_bf16_kernel<BM, BN, WM, WN, SplitK, false, true>
                                                       : gemm_bf16_kernel<BM, BN, WM, WN, SplitK, false, false>);
  launch(kernel, gemm_grid(g, BM, BN), kWarp * (BM / WM) * (BN / WN), 0, stream, g);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void gemm_bf16(bfloat16* c, Bf16GemmOperand a, Bf16GemmOperand b, const bfloat16* bias, std::int64_t m,
               std::int64_t n, std::int64_t k, const StridedLayout<2>& batch, cudaStream_t stream) {
  wgmma_products_chosen();  // an unknown ATTOGRAD_CUDA_WGMMA stops the first product, whatever its shape
  const std::int64_t batches = batch.numel;
  if (m == 0 || n == 0 || batches == 0) return;
  // K = 0 needs nothing apart: the loop over K is empty and C is the bias, or zero.
  Bf16GemmArgs g{a, b, c, bias, m, n, k, batches, batch, vector_ok(a, batch, 0), vector_ok(b, batch, 1)};
  g.k_slice = k;
  // The float32 partial products of g over `splits` slices of K (launch_slices(g)),
  // added in slice order with the bias and rounded once.
  const auto over_slices_of_k = [&](std::int64_t splits, auto launch_slices) {
    slice_k(g, splits, wgmma_runs(g) ? kWgmmaTileK : kBK);  // the sm_90a kernels' TMA copies whole tiles of a slice
    DeviceBuffer partial(sizeof(float) * g.splits * batches * m * n);
    g.partial = partial.as<float>();
    launch_slices(g);
    sum_slices<bfloat16>(c, partial.as<const float>(), bias, m, n, batches, g.splits, stream);
  };
  // Operands that allow 16-byte copies: the pipelined kernel, over slices of a long K
  // where its 128 x 256 tiles alone would leave SMs idle (a Linear's weight gradient).
  const int sms = multiprocessors();
  if (const std::int64_t splits = gemm_bf16_pipelined_splits(g, sms); splits > 0) {
    if (splits == 1) return launch_pipelined_product(g, stream);
    return over_slices_of_k(splits, [&](const Bf16GemmArgs& sliced) { launch_pipelined_product(sliced, stream); });
  }
  // The others: 128 x 128 tiles of 8 warps (64 x 32 each) reuse each loaded value
  // most; where they would leave SMs idle, 64 x 64 tiles of 4 warps (32 x 32 each),
  // and where even those would, 64 x 64 tiles over slices of K.
  const std::int64_t big_tiles = ((m + 127) / 128) * ((n + 127) / 128) * batches;
  if (big_tiles >= 2 * sms) return launch_gemm_bf16<128, 128, 64, 32, false>(g, stream);
  const std::int64_t splits = k_splits(((m + 63) / 64) * ((n + 63) / 64) * batches, k, sms);
  if (splits == 1) return launch_gemm_bf16<64, 64, 32, 32, false>(g, stream);
  over_slices_of_k(splits, [&](const Bf16GemmArgs& sliced) { launch_gemm_bf16<64, 64, 32, 32, true>(sliced, stream); });
}

namespace {

// Whether the pipelined kernel takes g (one m x n product with its epilogue)
// whole: its layout, C and its companions aligned (a null pointer is: fresh
// buffers will be), one job.
bool epilogue_taken(const Bf16GemmArgs& g) {
  const bool aligned = aligned16(g.c) && (!g.act || aligned16(g.act)) && (!g.pre || aligned16(g.pre));
  return g.m > 0 && g.n > 0 && aligned && gemm_bf16_pipelined_epilogue_layout(g) &&
         gemm_bf16_pipelined_splits(g, multiprocessors()) == 1;
}

// The product a gelu (grad false) or gelu_grad epilogue makes of a and b.
Bf16GemmArgs epilogue_args(Bf16GemmOperand a, Bf16GemmOperand b, std::int64_t m, std::int64_t n, std::int64_t k,
                           bool grad) {
  static const StridedLayout<2> batch = [] {
    StridedLayout<2> one;
    one.numel = 1;
    return one;
  }();
  Bf16GemmArgs g{a, b, nullptr, nullptr, m, n, k, 1, batch, vector_ok(a, batch, 0), vector_ok(b, batch, 1)};
  g.k_slice = k, g.epilogue = grad ? Bf16Epilogue::gelu_grad : Bf16Epilogue::gelu;
  return g;
}

}  // namespace

bool gemm_bf16_gelu_takes(Bf16GemmOperand a, Bf16GemmOperand b, std::int64_t m, std::int64_t n, std::int64_t k,
                          bool grad) {
  return epilogue_taken(epilogue_args(a, b, m, n, k, grad));
}

bool gemm_bf16_gelu(bfloat16* c, bfloat16* act, Bf16GemmOperand a, Bf16GemmOperand b, const bfloat16* bias,
                    std::int64_t m, std::int64_t n, std::int64_t k, cudaStream_t stream) {
  Bf16GemmArgs g = epilogue_args(a, b, m, n, k, false);
  g.c = c, g.bias = bias, g.act = act;
  if (!epilogue_taken(g)) return false;
  launch_pipelined_product(g, stream);
  return true;
}

bool gemm_bf16_gelu_grad(bfloat16* c, const bfloat16* pre, Bf16GemmOperand a, Bf16GemmOperand b, std::int64_t m,
                         std::int64_t n, std::int64_t k, cudaStream_t stream) {
  Bf16GemmArgs g = epilogue_args(a, b, m, n, k, true);
  g.c = c, g.pre = pre;
  if (!epilogue_taken(g)) return false;
  launch_pipelined_product(g, stream);
  return true;
}

}  // namespace attograd::cuda
