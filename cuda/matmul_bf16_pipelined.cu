// The bfloat16 product for large shapes: C = A B (+ bias), a block a 128 x 256
// tile of C, 8 warps of 64 x 64, mma.sync m16n8k16 with float32 sums
// (cuda/mma_bf16.cuh), each sum rounded once to bfloat16 as it is stored.
//
// What keeps the tensor cores fed, CUTLASS's multistage design:
// - A and B^T stream through kStages tiles of kBK = 32 along K, copied by
//   cp.async straight into shared memory, kStages - 1 tiles ahead of the one
//   the warps compute on: one wait and one barrier a tile, no register staging.
// - The tiles are stored unpadded and XOR-swizzled (cuda/gemm_tiles.h), each
//   as its operand lies in memory, so copies and ldmatrix (plain, or
//   transposing) meet no bank conflicts in any of the four layouts.
// - K's ragged end is the first tile (its values below the job's first k are
//   zeros), and which copies fall on edge rows (zero-filled, reading nothing)
//   is worked out once: the main loop has no bound to check, and each copy's
//   source moves by one constant a tile.
// - Fragments of the next 16 of K are loaded while the products of this one run.
// - Blocks go down groups of 8 tile rows before moving along N, so that the
//   blocks in flight share the tiles of A and B they read from L2.
// - C leaves through shared memory (swizzled too): 16-byte stores of whole
//   rows' chunks, the bias added before the one rounding; kernels of their own
//   apply the MLP's GELU (forward, or its gradient) on the way (Bf16Epilogue).
// gemm_bf16 (cuda/matmul_bf16.cu) sends here the products whose operands
// allow 16-byte copies: those with enough tiles to fill the GPU as they are,
// and those with too few over a long K in slices (split-K, as its other
// kernels take it: float32 partial products, summed in slice order).
#include <cstdint>
#include <type_traits>

#include "cuda/async_copy.cuh"
#include "cuda/gemm_bf16_epilogue.cuh"
#include "cuda/gemm_common.cuh"
#include "cuda/gemm_pipeline.cuh"
#include "cuda/gemm_tiles.h"
#include "cuda/mma_bf16.cuh"

namespace attograd::cuda {
namespace {

using namespace gemm_detail;
using namespace gemm_tiles;
using namespace gemm_pipeline;

constexpr int kPipelineBM = 128, kPipelineBN = 256;

template <bool Trans>
__device__ __forceinline__ void load_block(std::uint32_t (&r)[4], const std::uint16_t* tile, int offset) {
  load_matrices<Trans>(r, byte_offset(tile, offset));
}

// Where this thread's accumulators lie in C: the block's tile at (m0, n0),
// the warp's 64 x 64 in it, and lane (g, t) of the warp, which holds rows g
// and g + 8 of each 16 x 8 mma tile, columns 2t and 2t + 1.
struct AccumulatorAt {
  std::int64_t m0, n0;
  int warp_m, warp_n, g, t;
  __device__ __forceinline__ int row(int i, int half) const { return warp_m * kWarpTile + i * 16 + half * 8 + g; }
  __device__ __forceinline__ int col(int j) const { return warp_n * kWarpTile + j * 8 + 2 * t; }
};
constexpr int kFM = kWarpTile / 16, kFN = kWarpTile / 8;  // a warp's A and B fragments per step of 16
using Accumulators = float[kFM][kFN][4];                    // mma_bf16.cuh's C fragments of the warp's 16 x 8 tiles

// acc += the warp's share of one stage's A and B^T tiles: two steps of 16
// along K, the next step's fragments loaded while this one's products run.
template <bool AKFastest, bool BKFastest, typename AAt, typename BAt>
__device__ __forceinline__ void multiply_stage(Accumulators& acc, const std::uint16_t* a_tile, const std::uint16_t* b_tile,
                                               const AAt& a_at, const BAt& b_at) {
  std::uint32_t a_frag[2][kFM][4], b_frag[2][kFN][2];
  const auto load_step = [&](int step) {
#pragma unroll
    for (int f = 0; f < kFM; ++f) load_block<!AKFastest>(a_frag[step][f], a_tile, a_at.at(step, f));
#pragma unroll
    for (int f = 0; f < kFN / 2; ++f) {
      std::uint32_t r[4];
      load_block<!BKFastest>(r, b_tile, b_at.at(step, f));
      b_frag[step][2 * f][0] = r[0], b_frag[step][2 * f][1] = r[1];
      b_frag[step][2 * f + 1][0] = r[2], b_frag[step][2 * f + 1][1] = r[3];
    }
  };
  load_step(0);
#pragma unroll
  for (int step = 0; step < kBK / 16; ++step) {
    if (step + 1 < kBK / 16) load_step(step + 1);
#pragma unroll
    for (int i = 0; i < kFM; ++i)
#pragma unroll
      for (int j = 0; j < kFN; ++j) mma_bf16(acc[i][j], a_frag[step][i], b_frag[step][j]);
  }
}

// Split-K's partial product of the job, as it is: two neighbouring float32 values a lane and row.
__device__ __forceinline__ void store_partial(const Accumulators& acc, const Bf16GemmArgs& g, std::int64_t job,
                                              const AccumulatorAt& at) {
  float* const partial = g.partial + job * g.m * g.n;
  const bool pairs = g.n % 2 == 0;
#pragma unroll
  for (int i = 0; i < kFM; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const std::int64_t gm = at.m0 + at.row(i, half);
      if (gm >= g.m) continue;
#pragma unroll
      for (int j = 0; j < kFN; ++j) {
        const std::int64_t gn = at.n0 + at.col(j);
        float* out = partial + gm * g.n + gn;
        if (pairs && gn + 1 < g.n) {
          *reinterpret_cast<float2*>(out) = make_float2(acc[i][j][2 * half], acc[i][j][2 * half + 1]);
        } else {
          if (gn < g.n) out[0] = acc[i][j][2 * half];
          if (gn + 1 < g.n) out[1] = acc[i][j][2 * half + 1];
        }
      }
    }
}

// C's tile, bias added and rounded once, through shared memory (`staging`,
// free when called): each lane's 4-byte words into their swizzled chunks, then
// 16-byte stores of eight columns where the row holds them all and C allows
// it, with the epilogue on the way (g.act or g.pre its operand).
template <int BM, int BN, Bf16Epilogue Epilogue>
__device__ __forceinline__ void store_c(const Accumulators& acc, std::uint16_t* staging, const Bf16GemmArgs& g,
                                        std::int64_t job, const AccumulatorAt& at) {
  using Layout = typename PipelineShape<BM, BN>::CLayout;
#pragma unroll
  for (int j = 0; j < kFN; ++j) {
    const int col = at.col(j);
    float bias[2] = {0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < 2; ++c)
      if (g.bias && at.n0 + col + c < g.n) bias[c] = static_cast<float>(g.bias[at.n0 + col + c]);
#pragma unroll
    for (int i = 0; i < kFM; ++i)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<std::uint32_t*>(staging + Layout::at(at.row(i, half), col / kChunk) * kChunk + col % kChunk) =
            bf16_pair(bfloat16(acc[i][j][2 * half] + bias[0]).bits, bfloat16(acc[i][j][2 * half + 1] + bias[1]).bits);
  }
  __syncthreads();
  copy_out_c<BM, BN, PipelineShape<BM, BN>::kThreads, Epilogue>(staging, g, job, at.m0, at.n0,
                                                               static_cast<int>(threadIdx.x), BlockMeets{});
}

// SplitK: the job (batch z, slice s of K) writes its float32 partial product
// to g.partial (Bf16GemmArgs); otherwise C rounded to bfloat16, with the bias,
// and the epilogue (a kernel of its own: the plain ones carry none of it).
template <int BM, int BN, bool SplitK, bool ATransposed, bool BTransposed,
          Bf16Epilogue Epilogue = Bf16Epilogue::none>
__global__ void __launch_bounds__(PipelineShape<BM, BN>::kThreads, 1) gemm_bf16_pipelined_kernel(Bf16GemmArgs g) {
  using Shape = PipelineShape<BM, BN>;
  constexpr int kStages = Shape::kStages, kThreads = Shape::kThreads;
  constexpr bool a_k_fastest = !ATransposed, b_k_fastest = BTransposed;
  std::uint16_t* const smem = dynamic_shared_memory<std::uint16_t>();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const auto [m0, n0] = raster_tile<BM, BN>(g.m, g.n);
  const AccumulatorAt at{m0, n0, warp / Shape::kWarpsN, warp % Shape::kWarpsN, lane / 4, lane % 4};
  const FragmentOffsets<BM, a_k_fastest, kFM, std::uint16_t> a_at(at.warp_m * kWarpTile, lane, false);
  const FragmentOffsets<BN, b_k_fastest, kFN / 2, std::uint16_t> b_at(at.warp_n * kWarpTile, lane, true);
  // Stage s: A's tile, then B's.
  const auto stage_a = [&](int s) { return smem + s * Shape::kStageValues; };
  const auto stage_b = [&](int s) { return smem + s * Shape::kStageValues + BM * kBK; };

  const std::int64_t splits = SplitK ? g.splits : 1;
  for (std::int64_t job = blockIdx.z; job < g.batches * splits; job += gridDim.z) {
    const std::int64_t z = job / splits, k_begin = (job % splits) * g.k_slice;
    const std::int64_t k_end = SplitK ? min(g.k, k_begin + g.k_slice) : g.k;
    const int tiles = static_cast<int>((k_end - k_begin + kBK - 1) / kBK);
    const std::int64_t k_first = k_end - std::int64_t(tiles) * kBK;  // the ragged tile first: k_begin - kBK < k_first
    std::int64_t offset[2];
    offsets_at(g.batch, z, offset);
    const auto* a_data = reinterpret_cast<const std::uint16_t*>(g.a.data) + offset[0];
    const auto* b_data = reinterpret_cast<const std::uint16_t*>(g.b.data) + offset[1];
    OperandCopies<BM, a_k_fastest, kThreads, std::uint16_t> a_copies(a_data, g.a.ld, g.m, m0, k_first);
    OperandCopies<BN, b_k_fastest, kThreads, std::uint16_t> b_copies(b_data, g.b.ld, g.n, n0, k_first);

    start_pipeline<kStages>(a_copies, b_copies, stage_a, stage_b, tiles, k_first, k_begin);

    Accumulators acc = {};
    int read = 0, write = kStages - 1;
    for (int left = tiles; left > 0; --left) {  // left: tiles from this one to the last
      wait_async_copies<kStages - 2>();  // this thread's copies of this tile have landed
      // Everyone's have, and everyone is done with the last tile, whose stage the next copies overwrite.
      __syncthreads();
      if (left > kStages - 1) {
        a_copies.next(stage_a(write));
        b_copies.next(stage_b(write));
      }
      commit_async_copies();
      multiply_stage<a_k_fastest, b_k_fastest>(acc, stage_a(read), stage_b(read), a_at, b_at);
      read = read + 1 == kStages ? 0 : read + 1;
      write = write + 1 == kStages ? 0 : write + 1;
    }
    wait_async_copies<0>();  // only empty groups remain; none may land in C's staging below
    __syncthreads();
    if constexpr (SplitK)
      store_partial(acc, g, job, at);  // no shared memory: the next job may copy into it at once
    else
      store_c<BM, BN, Epilogue>(acc, smem, g, job, at);
  }
}

template <int BM, int BN, typename Kernel>
void launch_pipelined(Kernel kernel, const Bf16GemmArgs& g, cudaStream_t stream) {
  using Shape = PipelineShape<BM, BN>;
  allow_shared_memory(kernel, Shape::kSharedBytes);
  launch(kernel, pipelined_grid(g, BM, BN), Shape::kThreads, Shape::kSharedBytes, stream, g);
  CUDA_CHECK_LAUNCH();
}

template <int BM, int BN, bool SplitK>
void launch_pipelined(const Bf16GemmArgs& g, cudaStream_t stream) {
  const auto kernel = g.a.transposed ? (g.b.transposed ? gemm_bf16_pipelined_kernel<BM, BN, SplitK, true, true>
                                                       : gemm_bf16_pipelined_kernel<BM, BN, SplitK, true, false>)
                                     : (g.b.transposed ? gemm_bf16_pipelined_kernel<BM, BN, SplitK, false, true>
                                                       : gemm_bf16_pipelined_kernel<BM, BN, SplitK, false, false>);
  launch_pipelined<BM, BN>(kernel, g, stream);
}

}  // namespace

namespace gemm_detail {

std::int64_t gemm_bf16_pipelined_splits(const Bf16GemmArgs& g, int sms) {
  return pipelined_splits<kPipelineBM, kPipelineBN, kChunk>(g, sms);
}

void gemm_bf16_pipelined(const Bf16GemmArgs& g, cudaStream_t stream) {
  if (g.splits > 1) return launch_pipelined<kPipelineBM, kPipelineBN, true>(g, stream);
  launch_pipelined<kPipelineBM, kPipelineBN, false>(g, stream);
}

bool gemm_bf16_pipelined_epilogue_layout(const Bf16GemmArgs& g) {
  // The MLP's layouts: x W^T (gelu), dY W (gelu_grad).
  if (g.a.transposed) return false;
  return g.epilogue == Bf16Epilogue::gelu ? g.b.transposed : g.epilogue == Bf16Epilogue::gelu_grad && !g.b.transposed;
}

bool gemm_bf16_pipelined_epilogue(const Bf16GemmArgs& g, cudaStream_t stream) {
  if (!gemm_bf16_pipelined_epilogue_layout(g)) return false;
  if (g.epilogue == Bf16Epilogue::gelu)
    launch_pipelined<kPipelineBM, kPipelineBN>(
        gemm_bf16_pipelined_kernel<kPipelineBM, kPipelineBN, false, false, true, Bf16Epilogue::gelu>, g, stream);
  else
    launch_pipelined<kPipelineBM, kPipelineBN>(
        gemm_bf16_pipelined_kernel<kPipelineBM, kPipelineBN, false, false, false, Bf16Epilogue::gelu_grad>, g,
        stream);
  return true;
}

}  // namespace gemm_detail

}  // namespace attograd::cuda
