// The bfloat16 product on sm_90a's warpgroup products (cuda/wgmma.cuh): C =
// A B (+ bias) in all four operand layouts, a block a 128 x 256 tile of C,
// two warpgroups of 64 x 256, float32 sums each rounded once to bfloat16 as it
// is stored (or, over slices of K, kept as float32 partial products).
//
// - A and B^T stream through kStages tiles of 64 along K, copied by cp.async
//   straight into shared memory two tiles ahead of the one the products read,
//   each as its operand lies in memory: K-major (A as it is, B transposed) or
//   MN-major (A transposed, B as it is), in the tensor cores' 128-byte
//   swizzle (gemm_tiles::WgmmaTile); the instruction's transpose flags say which.
// - The products of a tile are four wgmma.mma_async m64n256k16 a warpgroup,
//   issued and left running: the warpgroup waits only for the previous tile's
//   (wgmma.wait_group 1), so a tile's products run while the next tile's
//   wait, barrier and copies are issued. A stage is overwritten two tiles
//   after its products were issued, once every warpgroup has waited for them
//   (the barrier of the tile between).
// - K's ragged end, edge rows, slices of K, the raster order of blocks and
//   C's way out (staged through shared memory, 16-byte stores, the MLP's GELU
//   epilogues) are the pipelined product's (cuda/gemm_pipeline.cuh,
//   cuda/gemm_bf16_epilogue.cuh).
// gemm_bf16 and gemm_bf16_gelu* (cuda/matmul_bf16.cu) send here what the
// pipelined kernel would take, where wgmma_kernels_run and
// wgmma_products_chosen say so (cuda/runtime.h).
#include <cstdint>

#include "cuda/async_copy.cuh"
#include "cuda/gemm_bf16_epilogue.cuh"
#include "cuda/gemm_common.cuh"
#include "cuda/gemm_pipeline.cuh"
#include "cuda/gemm_tiles.h"
#include "cuda/runtime.h"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_store.cuh"

namespace attograd::cuda {
namespace {

using namespace gemm_detail;
using namespace gemm_pipeline;

using wgmma_store::kAccumulators, wgmma_store::kBM, wgmma_store::kBN;
constexpr int kStages = 4, kTileThreads = wgmma_store::kThreads;
constexpr int kTileK = gemm_tiles::WgmmaTile<kBM, true>::kK;
constexpr int kABytes = kBM * kTileK * 2, kStageBytes = (kBM + kBN) * kTileK * 2;
// The stages, and room to start them on a 1024-byte boundary.
constexpr int kSharedBytes = kStages * kStageBytes + wgmma::kSwizzleBytes;
static_assert(kBM * kBN * 2 <= kStages * kStageBytes, "C's staged tile fits where the stages were");
// A warpgroup's 64 rows of A start 8 KiB into A's tile in both layouts: 64
// lines of 128 bytes (K-major), or the second block of 64 rows (MN-major).
static_assert(64 * wgmma::kLineBytes == wgmma::kMnBlockBytes);

template <int Rows, bool KFastest>
using Copies = OperandCopies<Rows, KFastest, kTileThreads, std::uint16_t, gemm_tiles::WgmmaTile<Rows, KFastest>>;

// SplitK: the job (batch z, slice s of K) writes its float32 partial product
// to g.partial; otherwise C rounded to bfloat16, with the bias and the epilogue.
template <bool ATransposed, bool BTransposed, bool SplitK, Bf16Epilogue Epilogue>
__global__ void __launch_bounds__(kTileThreads, 1) gemm_bf16_wgmma_kernel(Bf16GemmArgs g) {
  constexpr bool a_k_major = !ATransposed, b_k_major = BTransposed;
  unsigned char* const stages = wgmma::swizzle_aligned(dynamic_shared_memory<unsigned char>());
  const std::uint32_t stages_at = wgmma::shared_address(stages);
  const auto stage_a = [&](int s) { return reinterpret_cast<std::uint16_t*>(stages + s * kStageBytes); };
  const auto stage_b = [&](int s) { return reinterpret_cast<std::uint16_t*>(stages + s * kStageBytes + kABytes); };
  // This warpgroup's 64 rows of A's tile, and B's tile, in stage s.
  const int warpgroup = static_cast<int>(threadIdx.x) / wgmma::kWarpgroup;
  const auto a_at = [&](int s) { return stages_at + s * kStageBytes + warpgroup * wgmma::kMnBlockBytes; };
  const auto b_at = [&](int s) { return stages_at + s * kStageBytes + kABytes; };
  const auto [m0, n0] = raster_tile<kBM, kBN>(g.m, g.n);

  const std::int64_t splits = SplitK ? g.splits : 1;
  for (std::int64_t job = blockIdx.z; job < g.batches * splits; job += gridDim.z) {
    const std::int64_t z = job / splits, k_begin = (job % splits) * g.k_slice;
    const std::int64_t k_end = SplitK ? min(g.k, k_begin + g.k_slice) : g.k;
    const int tiles = static_cast<int>((k_end - k_begin + kTileK - 1) / kTileK);
    const std::int64_t k_first = k_end - std::int64_t(tiles) * kTileK;  // the ragged tile first
    std::int64_t offset[2];
    offsets_at(g.batch, z, offset);
    Copies<kBM, a_k_major> a_copies(reinterpret_cast<const std::uint16_t*>(g.a.data) + offset[0], g.a.ld, g.m, m0,
                                    k_first);
    Copies<kBN, b_k_major> b_copies(reinterpret_cast<const std::uint16_t*>(g.b.data) + offset[1], g.b.ld, g.n, n0,
                                    k_first);
    start_pipeline<kStages - 1>(a_copies, b_copies, stage_a, stage_b, tiles, k_first, k_begin);  // tiles 0 and 1

    float acc[kAccumulators];
#pragma unroll
    for (float& x : acc) x = 0.0f;
    for (int tile = 0; tile < tiles; ++tile) {
      const int read = tile % kStages;
      wait_async_copies<kStages - 3>();  // this thread's copies of this tile have landed
      wgmma::fence_async_shared();
      // Everyone's have, and every warpgroup has waited for the products of
      // two tiles ago, whose stage the next copies overwrite.
      __syncthreads();
      if (tile + kStages - 2 < tiles) {
        a_copies.next(stage_a((tile + kStages - 2) % kStages));
        b_copies.next(stage_b((tile + kStages - 2) % kStages));
      }
      commit_async_copies();
      wgmma::fence();
#pragma unroll
      for (int step = 0; step < kTileK / 16; ++step)
        wgmma::mma_bf16_n256<!a_k_major, !b_k_major>(acc, wgmma::tile_descriptor<a_k_major>(a_at(read), step),
                                                     wgmma::tile_descriptor<b_k_major>(b_at(read), step), true);
      wgmma::commit();
      wgmma::wait<1>();  // the last tile's products are done: their stage is free after the next barrier
    }
    wgmma::wait<0>();
    wait_async_copies<0>();  // only empty groups remain; none may land in C's staging below
    __syncthreads();
    const int t = static_cast<int>(threadIdx.x);
    if constexpr (SplitK)
      wgmma_store::store_partial(acc, g, job, m0, n0, t);  // no shared memory: the next job may copy into it at once
    else
      wgmma_store::store_c<Epilogue>(acc, reinterpret_cast<std::uint16_t*>(stages), g, job, m0, n0, t, BlockMeets{});
  }
}

template <typename Kernel>
void launch_tiles(Kernel kernel, const Bf16GemmArgs& g, cudaStream_t stream) {
  allow_shared_memory(kernel, kSharedBytes);
  launch(kernel, pipelined_grid(g, kBM, kBN), kTileThreads, kSharedBytes, stream, g);
  CUDA_CHECK_LAUNCH();
}

template <bool SplitK>
void launch_plain(const Bf16GemmArgs& g, cudaStream_t stream) {
  using enum Bf16Epilogue;
  if (g.a.transposed)
    return g.b.transposed ? launch_tiles(gemm_bf16_wgmma_kernel<true, true, SplitK, none>, g, stream)
                          : launch_tiles(gemm_bf16_wgmma_kernel<true, false, SplitK, none>, g, stream);
  return g.b.transposed ? launch_tiles(gemm_bf16_wgmma_kernel<false, true, SplitK, none>, g, stream)
                        : launch_tiles(gemm_bf16_wgmma_kernel<false, false, SplitK, none>, g, stream);
}

}  // namespace

namespace gemm_detail {

bool gemm_bf16_wgmma_takes(const Bf16GemmArgs& g) {
  return g.epilogue == Bf16Epilogue::none || (g.splits == 1 && gemm_bf16_pipelined_epilogue_layout(g));
}

void gemm_bf16_wgmma(const Bf16GemmArgs& g, cudaStream_t stream) {
  if (wgmma_products() == WgmmaProducts::tma && gemm_bf16_wgmma_tma(g, stream)) return;
  using enum Bf16Epilogue;
  if (g.splits > 1) return launch_plain<true>(g, stream);
  // The epilogues' kernels exist in their layouts alone (gemm_bf16_pipelined_epilogue_layout).
  if (g.epilogue == gelu) return launch_tiles(gemm_bf16_wgmma_kernel<false, true, false, gelu>, g, stream);
  if (g.epilogue == gelu_grad) return launch_tiles(gemm_bf16_wgmma_kernel<false, false, false, gelu_grad>, g, stream);
  launch_plain<false>(g, stream);
}

}  // namespace gemm_detail

}  // namespace attograd::cuda
