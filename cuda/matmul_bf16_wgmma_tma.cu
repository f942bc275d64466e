// The bfloat16 product on sm_90a's warpgroup products (cuda/wgmma.cuh) with
// its tiles copied by TMA (cuda/tma.cuh) and the block's warps in two roles:
// C = A B (+ bias) in all four operand layouts, whole K or in slices, the
// MLP's GELU epilogues, a block a 128 x 256 tile of C, as the cp.async kernel
// (cuda/matmul_bf16_wgmma.cu) makes it, whose tiles and copy-out it shares.
//
// - The producer, the block's first warpgroup, gives most of its registers
//   to the others (setmaxnreg) and one thread of it issues every copy: for
//   each tile of 64 along K, it waits until the stage's "empty" mbarrier says
//   the consumers are done with it, says how many bytes the stage's "full"
//   barrier is to expect, and names A's and B^T's boxes, which TMA copies in
//   the tensor cores' 128-byte swizzle (zeros past the matrices' edges and K's
//   end), kStages tiles ahead at most.
// - The consumers, two warpgroups of 64 x 256 of C, wait for a stage's full
//   barrier, issue its four wgmma m64n256k16 and leave them running; once the
//   previous tile's products are done (wgmma.wait_group 1) they arrive at its
//   empty barrier. No copies, addresses or block-wide barriers in their loop.
// - Persistent: a block an SM, each taking every gridDim.x-th work item (a
//   tile of C in a job), so that while the consumers store one tile's C (half
//   its rows at a time through 32 KiB of its own, cuda/wgmma_store.cuh, among
//   themselves at a named barrier) the producer already fills the stages
//   with the next item's tiles of K.
// The copies need what TMA needs (cuda/tma.cuh: 16-byte aligned bases and
// strides), one batch dim at most, every batch its own matrices, and slices of
// K of whole tiles: gemm_bf16_wgmma sends the rest to the cp.async kernel.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>

#include "cuda/gemm_bf16_epilogue.cuh"
#include "cuda/gemm_common.cuh"
#include "cuda/gemm_pipeline.cuh"
#include "cuda/gemm_tiles.h"
#include "cuda/mbarrier.cuh"
#include "cuda/runtime.h"
#include "cuda/tma.cuh"
#include "cuda/warp_roles.cuh"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_store.cuh"

namespace attograd::cuda {
namespace {

using namespace gemm_detail;
using namespace gemm_pipeline;
using wgmma_store::kAccumulators, wgmma_store::kBM, wgmma_store::kBN;

constexpr int kStages = 4, kTileK = 64;
constexpr int kConsumers = wgmma_store::kThreads;  // two warpgroups
constexpr int kThreads = wgmma::kWarpgroup + kConsumers;
constexpr int kABytes = kBM * kTileK * 2, kBBytes = kBN * kTileK * 2, kStageBytes = kABytes + kBBytes;
// The stages from a 1024-byte boundary, half of C's tile staged on its way out
// (the stages meanwhile fill with the next work's tiles), then each stage's
// full and empty barriers: 225 KiB of the 227 a block may have.
constexpr int kStagingBytes = wgmma_store::kHalfStagingBytes;
constexpr int kSharedBytes = wgmma::kSwizzleBytes + kStages * kStageBytes + kStagingBytes + 2 * kStages * 8;
static_assert(kSharedBytes <= 227 * 1024);
// setmaxnreg: the producer's 128 threads keep 40, the consumers' 256 get 232 (65536 in all at most).
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
static_assert(wgmma::kWarpgroup * kProducerRegisters + kConsumers * kConsumerRegisters <= 65536);
static_assert(64 * wgmma::kLineBytes == wgmma::kMnBlockBytes, "a warpgroup's 64 rows of A start 8 KiB in, either layout");
// The consumers' named barrier (0 is __syncthreads').
constexpr int kConsumersMeet = 1;

// The consumers' barrier, as copy_out_c takes it.
struct ConsumersMeet {
  __device__ __forceinline__ void operator()() const { warp_roles::sync(kConsumersMeet, kConsumers); }
};

// C's tiles in one job, and a launch's work items: every job's tiles.
AG_HOST_DEVICE std::int64_t c_tiles(const Bf16GemmArgs& g) { return ((g.m + kBM - 1) / kBM) * ((g.n + kBN - 1) / kBN); }
AG_HOST_DEVICE std::int64_t work_items(const Bf16GemmArgs& g, std::int64_t splits) {
  return c_tiles(g) * g.batches * splits;
}

// A block's work: tile (m0, n0) of C in job `job` (batch z, the slice of K
// from k_begin), and that slice's tiles of K. Work item w is tile w % tiles
// (in raster order) of job w / tiles: the blocks at work together share a job's A and B in L2.
struct Work {
  std::int64_t job, z, k_begin, m0, n0;
  int tiles;
  __device__ __forceinline__ Work(const Bf16GemmArgs& g, std::int64_t w, std::int64_t splits) {
    const std::int64_t tiles_of_c = c_tiles(g);
    job = w / tiles_of_c;
    const TileAt at = raster_tile_at<kBM, kBN>(g.m, g.n, w % tiles_of_c);
    m0 = at.m0, n0 = at.n0;
    z = job / splits;
    k_begin = (job % splits) * g.k_slice;
    const std::int64_t k_end = splits > 1 ? min(g.k, k_begin + g.k_slice) : g.k;
    tiles = static_cast<int>((k_end - k_begin + kTileK - 1) / kTileK);
  }
};

// A's tile (kBM rows) or B^T's (kBN), k0 to k0 + 63 of batch z, into `stage`:
// K-major, one box of every row; MN-major, boxes of 64 rows, 8 KiB apart.
template <int Rows, bool KMajor>
__device__ __forceinline__ void load_operand(const tma::TensorMap* map, std::uint32_t stage, std::uint32_t full,
                                             std::int64_t row0, std::int64_t k0, std::int64_t z) {
  if constexpr (KMajor) {
    tma::load_box(map, stage, full, static_cast<int>(k0), static_cast<int>(row0), static_cast<int>(z));
  } else {
#pragma unroll
    for (int block = 0; block < Rows / 64; ++block)
      tma::load_box(map, stage + block * wgmma::kMnBlockBytes, full, static_cast<int>(row0 + 64 * block),
                    static_cast<int>(k0), static_cast<int>(z));
  }
}

template <bool ATransposed, bool BTransposed, bool SplitK, Bf16Epilogue Epilogue>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_bf16_wgmma_tma_kernel(const __grid_constant__ tma::TensorMap a_map,
                               const __grid_constant__ tma::TensorMap b_map, Bf16GemmArgs g) {
  constexpr bool a_k_major = !ATransposed, b_k_major = BTransposed;
  unsigned char* const stages = wgmma::swizzle_aligned(dynamic_shared_memory<unsigned char>());
  const std::uint32_t stages_at = wgmma::shared_address(stages);
  const auto stage_a = [&](int s) { return stages_at + s * kStageBytes; };
  const auto stage_b = [&](int s) { return stages_at + s * kStageBytes + kABytes; };
  auto* const staging = reinterpret_cast<std::uint16_t*>(stages + kStages * kStageBytes);
  const auto full = [&](int s) { return stages_at + kStages * kStageBytes + kStagingBytes + 8 * s; };
  const auto empty = [&](int s) { return full(kStages + s); };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier::init(full(s), 1);               // the producer's arrival, and the stage's bytes
      mbarrier::init(empty(s), kConsumers);     // every consumer, its products of the stage done
    }
    mbarrier::fence_init();
  }
  __syncthreads();  // the last block-wide barrier: the producer's other warps leave

  const std::int64_t splits = SplitK ? g.splits : 1;
  const std::int64_t work = work_items(g, splits);
  const int warpgroup = static_cast<int>(threadIdx.x) / wgmma::kWarpgroup;
  // Tiles of K copied (or consumed) in the block's earlier work and this one:
  // tile `it` in stage it % kStages, its barriers' phase it / kStages.
  int it = 0;
  if (warpgroup == 0) {
    warp_roles::release_registers<kProducerRegisters>();
    if (threadIdx.x != 0) return;
    for (std::int64_t w = blockIdx.x; w < work; w += gridDim.x) {
      const Work u(g, w, splits);
      for (int tile = 0; tile < u.tiles; ++tile, ++it) {
        const int s = it % kStages;
        mbarrier::wait(empty(s), (it / kStages & 1) ^ 1);
        mbarrier::arrive_expect_bytes(full(s), kStageBytes);
        const std::int64_t k0 = u.k_begin + std::int64_t(tile) * kTileK;
        load_operand<kBM, a_k_major>(&a_map, stage_a(s), full(s), u.m0, k0, u.z);
        load_operand<kBN, b_k_major>(&b_map, stage_b(s), full(s), u.n0, k0, u.z);
      }
    }
    return;
  }

  warp_roles::claim_registers<kConsumerRegisters>();
  const int t = static_cast<int>(threadIdx.x) - wgmma::kWarpgroup;  // among the consumers
  const std::uint32_t a_rows = (warpgroup - 1) * wgmma::kMnBlockBytes;  // this warpgroup's 64 rows of A's tile
  for (std::int64_t w = blockIdx.x; w < work; w += gridDim.x) {
    const Work u(g, w, splits);
    float acc[kAccumulators];
#pragma unroll
    for (float& x : acc) x = 0.0f;
    for (int tile = 0; tile < u.tiles; ++tile, ++it) {
      const int s = it % kStages;
      mbarrier::wait(full(s), it / kStages & 1);
      wgmma::fence();
#pragma unroll
      for (int step = 0; step < kTileK / 16; ++step)
        wgmma::mma_bf16_n256<!a_k_major, !b_k_major>(acc, wgmma::tile_descriptor<a_k_major>(stage_a(s) + a_rows, step),
                                                     wgmma::tile_descriptor<b_k_major>(stage_b(s), step), true);
      wgmma::commit();
      wgmma::wait<1>();  // the previous tile's products are done: its stage may be copied into
      if (tile > 0) mbarrier::arrive(empty((it - 1) % kStages));
    }
    wgmma::wait<0>();
    if (u.tiles > 0) mbarrier::arrive(empty((it - 1) % kStages));  // the producer fills it with the next work's
    if constexpr (SplitK)
      wgmma_store::store_partial(acc, g, u.job, u.m0, u.n0, t);
    else
      wgmma_store::store_c_by_halves<Epilogue>(acc, staging, g, u.job, u.m0, u.n0, t, ConsumersMeet{});
  }
}

// Operand x's tensor for TMA: K-major (rows of K, ld apart) or MN-major (lines
// of `rows` along K), one plane a batch; rows_in_box of the tile's rows a box.
tma::Bf16Tensor operand_tensor(const Bf16GemmOperand& x, bool k_major, std::int64_t rows, std::int64_t k,
                               std::int64_t batches, std::int64_t batch_stride, int rows_in_box) {
  tma::Bf16Tensor t{x.data, {}, {x.ld, batch_stride}, {}};
  if (k_major) {
    t.extent[0] = k, t.extent[1] = rows;
    t.box[0] = kTileK, t.box[1] = rows_in_box;
  } else {
    t.extent[0] = rows, t.extent[1] = k;
    t.box[0] = 64, t.box[1] = kTileK;
  }
  t.extent[2] = batches;
  return t;
}

struct OperandTensors {
  tma::Bf16Tensor a, b;
};

// A's and B^T's tensors where TMA can copy g's tiles, else nothing.
std::optional<OperandTensors> operand_tensors(const Bf16GemmArgs& g) {
  if (g.batch.ndim > 1 || g.k == 0) return std::nullopt;
  if (g.splits > 1 && g.k_slice % kTileK != 0) return std::nullopt;  // a tile would reach into the next slice
  // One batch dim, each batch its own A and B (a broadcast operand has stride 0); one batch: any stride.
  const std::int64_t a_stride = g.batch.ndim == 1 ? g.batch.strides[0][0] : g.a.ld;
  const std::int64_t b_stride = g.batch.ndim == 1 ? g.batch.strides[1][0] : g.b.ld;
  if (g.batch.ndim == 1 && g.batch.contiguous) return std::nullopt;
  const OperandTensors t{operand_tensor(g.a, !g.a.transposed, g.m, g.k, g.batches, a_stride, kBM),
                         operand_tensor(g.b, g.b.transposed, g.n, g.k, g.batches, b_stride, kBN)};
  if (!tma::tile_map_allowed(t.a) || !tma::tile_map_allowed(t.b)) return std::nullopt;
  return t;
}

std::atomic<std::int64_t> launches{0};

template <typename Kernel>
void launch_tiles(Kernel kernel, const OperandTensors& t, const Bf16GemmArgs& g, cudaStream_t stream) {
  allow_shared_memory(kernel, kSharedBytes);
  ++launches;
  // Persistent: a block an SM (as many as there is work for), each taking every gridDim.x-th work item.
  const std::int64_t work = work_items(g, g.splits);
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>(work, multiprocessor_count(device)));
  cuda::launch(kernel, blocks, kThreads, kSharedBytes, stream, tma::tile_map(t.a),
               tma::tile_map(t.b), g);
  CUDA_CHECK_LAUNCH();
}

template <bool SplitK>
void launch_plain(const OperandTensors& t, const Bf16GemmArgs& g, cudaStream_t stream) {
  using enum Bf16Epilogue;
  if (g.a.transposed)
    return g.b.transposed ? launch_tiles(gemm_bf16_wgmma_tma_kernel<true, true, SplitK, none>, t, g, stream)
                          : launch_tiles(gemm_bf16_wgmma_tma_kernel<true, false, SplitK, none>, t, g, stream);
  return g.b.transposed ? launch_tiles(gemm_bf16_wgmma_tma_kernel<false, true, SplitK, none>, t, g, stream)
                        : launch_tiles(gemm_bf16_wgmma_tma_kernel<false, false, SplitK, none>, t, g, stream);
}

}  // namespace

std::int64_t wgmma_tma_launches() { return launches; }

namespace gemm_detail {

bool gemm_bf16_wgmma_tma(const Bf16GemmArgs& g, cudaStream_t stream) {
  const std::optional<OperandTensors> t = operand_tensors(g);
  if (!t) return false;
  using enum Bf16Epilogue;
  if (g.splits > 1) {
    launch_plain<true>(*t, g, stream);
  } else if (g.epilogue == gelu) {
    launch_tiles(gemm_bf16_wgmma_tma_kernel<false, true, false, gelu>, *t, g, stream);
  } else if (g.epilogue == gelu_grad) {
    launch_tiles(gemm_bf16_wgmma_tma_kernel<false, false, false, gelu_grad>, *t, g, stream);
  } else {
    launch_plain<false>(*t, g, stream);
  }
  return true;
}

}  // namespace gemm_detail

}  // namespace attograd::cuda
