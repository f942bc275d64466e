// The bfloat16 product on sm_90a's warpgroup products (cuda/wgmma.cuh): C =
// A B (+ bias) with A as it is and B transposed (both K-major: a Linear
// layer's x W^T), a block a 128 x 256 tile of C, two warpgroups of 64 x 256,
// float32 sums each rounded once to bfloat16 as it is stored.
//
// - A and B^T stream through kStages tiles of 64 along K (128-byte lines, the
//   tensor cores' 128-byte swizzle), copied by cp.async straight into shared
//   memory two tiles ahead of the one the products read.
// - The products of a tile are four wgmma.mma_async m64n256k16 a warpgroup,
//   issued and left running: the warpgroup waits only for the previous tile's
//   (wgmma.wait_group 1), so a tile's products run while the next tile's
//   wait, barrier and copies are issued. A stage is overwritten two tiles
//   after its products were issued, once every warpgroup has waited for them
//   (the barrier of the tile between).
// - K's ragged end, edge rows, the raster order of blocks and C's way out
//   (staged through shared memory, 16-byte stores) are the pipelined
//   product's (cuda/gemm_pipeline.cuh, cuda/gemm_bf16_epilogue.cuh).
// gemm_bf16 and gemm_bf16_gelu (cuda/matmul_bf16.cu) send here what the
// pipelined kernel would take whole (no slices of K) in this layout, where
// wgmma_kernels_run and wgmma_products_chosen say so (cuda/runtime.h).
#include <cstdint>

#include "cuda/async_copy.cuh"
#include "cuda/gemm_bf16_epilogue.cuh"
#include "cuda/gemm_common.cuh"
#include "cuda/gemm_pipeline.cuh"
#include "cuda/gemm_tiles.h"
#include "cuda/wgmma.cuh"

namespace attograd::cuda {
namespace {

using namespace gemm_detail;
using namespace gemm_pipeline;

constexpr int kBM = 128, kBN = 256, kStages = 4, kTileThreads = 2 * wgmma::kWarpgroup;
constexpr int kTileKBytes = wgmma::kLineBytes;  // 64 bfloat16 of K a line
using ACopies = OperandCopies<kBM, true, kTileThreads, std::uint16_t, kTileKBytes>;
using BCopies = OperandCopies<kBN, true, kTileThreads, std::uint16_t, kTileKBytes>;
constexpr int kTileK = ACopies::kK;
constexpr int kABytes = kBM * wgmma::kLineBytes, kStageBytes = (kBM + kBN) * wgmma::kLineBytes;
// The stages, and room to start them on a 1024-byte boundary.
constexpr int kSharedBytes = kStages * kStageBytes + wgmma::kSwizzleBytes;
constexpr int kAccumulators = kBN / 2;  // a thread's of its warpgroup's 64 x 256
static_assert(kBM * kBN * 2 <= kStages * kStageBytes, "C's staged tile fits where the stages were");

// This thread's sums (wgmma.cuh's layout) into C's staged tile, bias added and
// rounded once, two neighbouring columns a 4-byte word; then out to C, with
// the MLP's GELU on the way where Epilogue asks (x W^T's layout: gelu alone).
template <Bf16Epilogue Epilogue>
__device__ __forceinline__ void store_c(const float (&acc)[kAccumulators], std::uint16_t* staging,
                                        const Bf16GemmArgs& g, std::int64_t job, std::int64_t m0, std::int64_t n0) {
  using Layout = gemm_tiles::Swizzle<kBN / gemm_tiles::kChunk>;
  constexpr int kChunk = gemm_tiles::kChunk;
  const int t = opaque(static_cast<int>(threadIdx.x));
  const int row0 = t / wgmma::kWarpgroup * 64 + t % wgmma::kWarpgroup / 32 * 16 + t % 32 / 4;
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j) {
    const int col = 8 * j + 2 * (t % 4);
    float bias[2] = {0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < 2; ++c)
      if (g.bias && n0 + col + c < g.n) bias[c] = static_cast<float>(g.bias[n0 + col + c]);
#pragma unroll
    for (int half = 0; half < 2; ++half)
      *reinterpret_cast<std::uint32_t*>(staging + Layout::at(row0 + 8 * half, j) * kChunk + col % kChunk) =
          bf16_pair(bfloat16(acc[4 * j + 2 * half] + bias[0]).bits, bfloat16(acc[4 * j + 2 * half + 1] + bias[1]).bits);
  }
  __syncthreads();
  copy_out_c<kBM, kBN, kTileThreads, Epilogue>(staging, g, job, m0, n0);
}

template <Bf16Epilogue Epilogue>
__global__ void __launch_bounds__(kTileThreads, 1) gemm_bf16_wgmma_kernel(Bf16GemmArgs g) {
  auto* const smem = dynamic_shared_memory<unsigned char>();
  // The stages from the first 1024-byte boundary: the swizzle is of addresses.
  const std::uint32_t skip = (wgmma::kSwizzleBytes - wgmma::shared_address(smem) % wgmma::kSwizzleBytes) %
                             wgmma::kSwizzleBytes;
  unsigned char* const stages = smem + skip;
  const std::uint32_t stages_at = wgmma::shared_address(stages);
  const auto stage_a = [&](int s) { return reinterpret_cast<std::uint16_t*>(stages + s * kStageBytes); };
  const auto stage_b = [&](int s) { return reinterpret_cast<std::uint16_t*>(stages + s * kStageBytes + kABytes); };
  // This warpgroup's 64 rows of A's tile, and B's tile, in stage s.
  const int warpgroup = static_cast<int>(threadIdx.x) / wgmma::kWarpgroup;
  const auto a_at = [&](int s) { return stages_at + s * kStageBytes + warpgroup * 64 * wgmma::kLineBytes; };
  const auto b_at = [&](int s) { return stages_at + s * kStageBytes + kABytes; };
  const auto [m0, n0] = raster_tile<kBM, kBN>(g.m, g.n);

  for (std::int64_t job = blockIdx.z; job < g.batches; job += gridDim.z) {
    const int tiles = static_cast<int>((g.k + kTileK - 1) / kTileK);
    const std::int64_t k_first = g.k - std::int64_t(tiles) * kTileK;  // the ragged tile first
    std::int64_t offset[2];
    offsets_at(g.batch, job, offset);
    ACopies a_copies(reinterpret_cast<const std::uint16_t*>(g.a.data) + offset[0], g.a.ld, g.m, m0, k_first);
    BCopies b_copies(reinterpret_cast<const std::uint16_t*>(g.b.data) + offset[1], g.b.ld, g.n, n0, k_first);
    start_pipeline<kStages - 1>(a_copies, b_copies, stage_a, stage_b, tiles, k_first, 0);  // tiles 0 and 1

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
        wgmma::mma_bf16_n256(acc, wgmma::k_major_descriptor(a_at(read), step),
                             wgmma::k_major_descriptor(b_at(read), step), true);
      wgmma::commit();
      wgmma::wait<1>();  // the last tile's products are done: their stage is free after the next barrier
    }
    wgmma::wait<0>();
    wait_async_copies<0>();  // only empty groups remain; none may land in C's staging below
    __syncthreads();
    store_c<Epilogue>(acc, reinterpret_cast<std::uint16_t*>(stages), g, job, m0, n0);
  }
}

}  // namespace

namespace gemm_detail {

bool gemm_bf16_wgmma_takes(const Bf16GemmArgs& g) {
  return !g.a.transposed && g.b.transposed && g.splits == 1 &&
         (g.epilogue == Bf16Epilogue::none || g.epilogue == Bf16Epilogue::gelu);
}

void gemm_bf16_wgmma(const Bf16GemmArgs& g, cudaStream_t stream) {
  const auto kernel = g.epilogue == Bf16Epilogue::gelu ? gemm_bf16_wgmma_kernel<Bf16Epilogue::gelu>
                                                       : gemm_bf16_wgmma_kernel<Bf16Epilogue::none>;
  allow_shared_memory(kernel, kSharedBytes);
  launch(kernel, pipelined_grid(g, kBM, kBN), kTileThreads, kSharedBytes, stream, g);
  CUDA_CHECK_LAUNCH();
}

}  // namespace gemm_detail

}  // namespace attograd::cuda
