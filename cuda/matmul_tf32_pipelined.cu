// SGEMM for large shapes on the tensor cores, in float32 accuracy (3xTF32,
// cuda/mma.cuh): C = A B, a block a 128 x 256 tile of C, 8 warps of 64 x 64.
// The pipelined bfloat16 product's skeleton (cuda/matmul_bf16_pipelined.cu:
// cp.async stages of swizzled tiles, K's ragged tile first, each thread's
// copies worked out once, blocks rasterised), with what float32 adds:
// - Each value is split into its big and small TF32 parts once a block, not
//   by each of the 4 (A) or 2 (B) warps that read it: splitting is six
//   instructions a value, as many as its three products' share of issue
//   slots. The thread that copied a chunk splits it once it has landed (its
//   own copies: no barrier before) into one of two split tiles; the tile's one
//   barrier then shows the split to every warp, whose products read it while
//   the next tile is split into the other.
// - With k fastest the split tiles keep the stages' layout, and ldmatrix reads
//   the TF32 fragments as it reads bfloat16 ones (a 32-bit value is two 16-bit
//   halves of a row). With rows fastest, which ldmatrix cannot transpose at 32
//   bits, the split tiles are laid out for the fragments
//   (gemm_tiles::SplitPairTile: an mma step takes k 4s + t and 4s + t + 8): a
//   lane reads its whole A fragment as one 16-byte load, the rows of each
//   16-row block permuted (row 2g is the fragment's row g, 2g + 1 its g + 8)
//   and put back as C leaves, and a B fragment as one 8-byte load.
// - C leaves from the registers, a lane's two neighbouring values of a row in
//   one 8-byte store. Without the bias: with its pointer the kernel with B as
//   it is spilled inside its loop (255 registers), so sgemm adds it after.
// sgemm (cuda/matmul.cu) sends here the tensor cores' float32 products whose
// operands allow 16-byte copies of whole chunks of four: those with enough
// tiles to fill the GPU as they are, and those with too few over a long K in
// slices (the partial products summed in slice order, as its other kernels do).
#include <cstdint>

#include "cuda/async_copy.cuh"
#include "cuda/gemm_common.cuh"
#include "cuda/gemm_pipeline.cuh"
#include "cuda/gemm_tiles.h"
#include "cuda/mma_bf16.cuh"

namespace attograd::cuda {
namespace {

using namespace gemm_detail;
using namespace gemm_pipeline;
using gemm_tiles::kBKFloat;
using gemm_tiles::kWarpTile;

constexpr int kBM = 128, kBN = 256, kWarpsN = kBN / kWarpTile, kBlockThreads = 32 * (kBM / kWarpTile) * kWarpsN;
constexpr int kStages = 4;
constexpr int kATileBytes = kBM * kBKFloat * 4, kBTileBytes = kBN * kBKFloat * 4;
constexpr int kStageBytes = kATileBytes + kBTileBytes;
// kStages stages as copied, then two split tiles, each A's big and small parts and B's.
constexpr int kSplitBytes = 2 * kStageBytes;
constexpr int kSharedBytes = kStages * kStageBytes + 2 * kSplitBytes;

constexpr int kFM = kWarpTile / 16, kFN = kWarpTile / 8;  // a warp's A and B fragments per mma step of 8
using Accumulators = float[kFM][kFN][4];                    // mma.cuh's C fragments of the warp's 16 x 8 tiles

// Where the parts of one operand's tile lie.
struct SplitTile {
  float *big, *small;
};

__device__ __forceinline__ uint4 big_parts(float4 x) {
  return make_uint4(tf32_big(x.x), tf32_big(x.y), tf32_big(x.z), tf32_big(x.w));
}
__device__ __forceinline__ uint4 small_parts(float4 x) {
  return make_uint4(tf32_small(x.x), tf32_small(x.y), tf32_small(x.z), tf32_small(x.w));
}

// The chunks this thread copied into `stage`, split into `to`, each a 16-byte
// read and two 16-byte writes (every phase of eight threads on all 32 banks,
// as its copies were). With k fastest a chunk keeps its place; with rows
// fastest copy i, at k < 8, and copy i + 8 / R, at k + 8 (R lines a round of
// copies), go to SplitPairTile's two chunks as pairs.
template <int Rows, bool KFastest, int Group, typename Copies>
__device__ __forceinline__ void split_own_chunks(const Copies& copies, const float* stage, SplitTile to) {
  const auto raw = [&](int i) {
    return *reinterpret_cast<const float4*>(byte_offset(stage, copies.destination + i * Copies::kApartBytes));
  };
  if constexpr (KFastest) {
#pragma unroll
    for (int i = 0; i < Copies::kCopies; ++i) {
      const int at = copies.destination + i * Copies::kApartBytes;
      const float4 x = raw(i);
      *reinterpret_cast<uint4*>(byte_offset(to.big, at)) = big_parts(x);
      *reinterpret_cast<uint4*>(byte_offset(to.small, at)) = small_parts(x);
    }
  } else {
    using Tile = typename Copies::Tile;
    using Split = gemm_tiles::SplitPairTile<Rows, Group>;
    constexpr int kRound = kBlockThreads / Tile::kLineChunks, kPartner = 8 / kRound;
    static_assert(kPartner == 1 || kRound % 4 == 0, "pairs a whole number of PairSwizzle's periods apart");
    const int c = static_cast<int>(threadIdx.x) % Tile::kLineChunks;
    // Chunk 2c of the first pair's line; 2c + 1 is its neighbour (16 bytes
    // apart, either way), and pair i lies i * kRound lines on.
    const int first = Split::at(static_cast<int>(threadIdx.x) / Tile::kLineChunks, 2 * c) * 16;
#pragma unroll
    for (int i = 0; i < kPartner; ++i) {
      const float4 x = raw(i), y = raw(i + kPartner);  // rows 4c to 4c + 3 at k, and at k + 8
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // Rows 4c + 2h and 4c + 2h + 1: A's as a pair at k then at k + 8, B's each at k then at k + 8.
        const float4 v = Group == 2 ? (h ? make_float4(x.z, x.w, y.z, y.w) : make_float4(x.x, x.y, y.x, y.y))
                                    : (h ? make_float4(x.z, y.z, x.w, y.w) : make_float4(x.x, y.x, x.y, y.y));
        const int at = (first + i * kRound * Split::kLineChunks * 16) ^ (16 * h);
        *reinterpret_cast<uint4*>(byte_offset(to.big, at)) = big_parts(v);
        *reinterpret_cast<uint4*>(byte_offset(to.small, at)) = small_parts(v);
      }
    }
  }
}

// This lane's reads in a split tile whose rows run fastest (SplitPairTile), in
// bytes from its first: for each item (a 16-row block of A, or an 8-column B
// fragment) at mma step `step`. The layout repeats every 4 lines and every 32
// rows (256 bytes of a line: two values a row), so only the items within 32
// rows take a register each; the rest, and the second step, are constants on.
template <int Rows, int Group>
struct WordOffsets {
  using Split = gemm_tiles::SplitPairTile<Rows, Group>;
  static constexpr int kItemRows = 8 * Group, kPeriod = 32 / kItemRows;
  int base[kPeriod];
  __device__ __forceinline__ WordOffsets(int warp_row0, int lane) {
#pragma unroll
    for (int i = 0; i < kPeriod; ++i) base[i] = Split::lane_word(warp_row0 + kItemRows * i, 0, lane) * 4;
  }
  __device__ __forceinline__ int at(int step, int item) const {
    return base[item % kPeriod] + item / kPeriod * 256 + step * 4 * Split::kLineChunks * 16;
  }
};

__device__ __forceinline__ void load_matrices_at(std::uint32_t (&r)[4], const float* tile, int offset) {
  load_matrices<false>(r, reinterpret_cast<const std::uint16_t*>(byte_offset(tile, offset)));
}

// Block f's A fragment at `step` (four values: rows g, g + 8 at k t, t + 4),
// big and small parts.
template <bool KFastest, typename AAt>
__device__ __forceinline__ SplitFragment<4> a_fragment(SplitTile a, const AAt& a_at, int step, int f) {
  SplitFragment<4> x;
  if constexpr (KFastest) {
    load_matrices_at(x.big, a.big, a_at.at(step, f));
    load_matrices_at(x.small, a.small, a_at.at(step, f));
  } else {
    const uint4 big = *reinterpret_cast<const uint4*>(byte_offset(a.big, a_at.at(step, f)));
    const uint4 small = *reinterpret_cast<const uint4*>(byte_offset(a.small, a_at.at(step, f)));
    x = {{big.x, big.y, big.z, big.w}, {small.x, small.y, small.z, small.w}};
  }
  return x;
}

// B fragments 2p and 2p + 1 at `step` (two values each: k t and t + 4 of column g).
template <bool KFastest, typename BAt>
__device__ __forceinline__ void b_fragments(SplitFragment<2> (&b)[kFN], SplitTile tile, const BAt& b_at, int step,
                                            int p) {
  if constexpr (KFastest) {
    std::uint32_t big[4], small[4];
    load_matrices_at(big, tile.big, b_at.at(step, p));
    load_matrices_at(small, tile.small, b_at.at(step, p));
    b[2 * p] = {{big[0], big[1]}, {small[0], small[1]}};
    b[2 * p + 1] = {{big[2], big[3]}, {small[2], small[3]}};
  } else {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int j = 2 * p + e;
      const uint2 big = *reinterpret_cast<const uint2*>(byte_offset(tile.big, b_at.at(step, j)));
      const uint2 small = *reinterpret_cast<const uint2*>(byte_offset(tile.small, b_at.at(step, j)));
      b[j] = {{big.x, big.y}, {small.x, small.y}};
    }
  }
}

// acc += the warp's share of one split tile: two mma steps of 8 along K.
template <bool AKFastest, bool BKFastest, typename AAt, typename BAt>
__device__ __forceinline__ void multiply_tile(Accumulators& acc, SplitTile a, SplitTile b, const AAt& a_at,
                                              const BAt& b_at) {
#pragma unroll
  for (int step = 0; step < kBKFloat / 8; ++step) {
    SplitFragment<2> b_frag[kFN];
#pragma unroll
    for (int p = 0; p < kFN / 2; ++p) b_fragments<BKFastest>(b_frag, b, b_at, step, p);
#pragma unroll
    for (int i = 0; i < kFM; ++i) {
      const SplitFragment<4> a_frag = a_fragment<AKFastest>(a, a_at, step, i);
#pragma unroll
      for (int j = 0; j < kFN; ++j) mma_3xtf32(acc[i][j], a_frag, b_frag[j]);
    }
  }
}

// C's tile from the accumulators: lane (g, t) holds, of each 16 x 8 mma tile,
// columns 2t and 2t + 1 of fragment rows g and g + 8, which are rows g and
// g + 8 of the block where A's k runs fastest, else rows 2g and 2g + 1 (the
// file's opening comment). Two neighbouring values in one 8-byte store: a
// quad's four cover 32 bytes of a row, a whole sector.
template <bool AKFastest>
__device__ __forceinline__ void store_c(const Accumulators& acc, const GemmArgs& g, std::int64_t job, std::int64_t m0,
                                        std::int64_t n0, int warp_m, int warp_n, int lane) {
  const int gr = lane / 4, t = lane % 4;
  float* const c = g.c + job * g.m * g.n;
#pragma unroll
  for (int i = 0; i < kFM; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const std::int64_t gm = m0 + warp_m * kWarpTile + 16 * i + (AKFastest ? 8 * half + gr : 2 * gr + half);
      if (gm >= g.m) continue;
      float* const out = c + gm * g.n;
#pragma unroll
      for (int j = 0; j < kFN; ++j) {
        const std::int64_t gn = n0 + warp_n * kWarpTile + 8 * j + 2 * t;
        const float c0 = acc[i][j][2 * half], c1 = acc[i][j][2 * half + 1];
        if (g.c_vec && gn + 2 <= g.n) {  // c_vec: C 16-byte aligned and N a multiple of 4
          *reinterpret_cast<float2*>(out + gn) = make_float2(c0, c1);
        } else {
          if (gn < g.n) out[gn] = c0;
          if (gn + 1 < g.n) out[gn + 1] = c1;
        }
      }
    }
}

// A tile's fragment offsets: ldmatrix's where k runs fastest, words' otherwise.
template <bool KFastest, int Rows, bool BPair>
__device__ __forceinline__ auto fragment_offsets(int warp_row0, int lane) {
  if constexpr (KFastest)
    return FragmentOffsets<Rows, true, BPair ? kFN / 2 : kFM, float>(warp_row0, lane, BPair);
  else
    return WordOffsets<Rows, BPair ? 1 : 2>(warp_row0, lane);
}

// Job z * g.splits + s: batch z's product over slice s of K (all of it when
// g.splits is 1), into g.c + job * m * n.
template <bool ATransposed, bool BTransposed>
__global__ void __launch_bounds__(kBlockThreads, 1) sgemm_tf32_pipelined_kernel(GemmArgs g) {
  constexpr bool a_k_fastest = !ATransposed, b_k_fastest = BTransposed;
  float* const smem = dynamic_shared_memory<float>();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  const auto [m0, n0] = raster_tile<kBM, kBN>(g.m, g.n);
  const auto a_at = fragment_offsets<a_k_fastest, kBM, false>(warp_m * kWarpTile, lane);
  const auto b_at = fragment_offsets<b_k_fastest, kBN, true>(warp_n * kWarpTile, lane);
  const auto stage_a = [&](int s) { return byte_offset(smem, s * kStageBytes); };
  const auto stage_b = [&](int s) { return byte_offset(smem, s * kStageBytes + kATileBytes); };
  const auto split_a = [&](int buf) {
    float* const tile = byte_offset(smem, kStages * kStageBytes + buf * kSplitBytes);
    return SplitTile{tile, byte_offset(tile, kATileBytes)};
  };
  const auto split_b = [&](int buf) {
    float* const tile = byte_offset(smem, kStages * kStageBytes + buf * kSplitBytes + 2 * kATileBytes);
    return SplitTile{tile, byte_offset(tile, kBTileBytes)};
  };

  for (std::int64_t job = blockIdx.z; job < g.batches * g.splits; job += gridDim.z) {
    const std::int64_t z = job / g.splits, k_begin = (job % g.splits) * g.k_slice;
    const std::int64_t k_end = min(g.k, k_begin + g.k_slice);
    const int tiles = static_cast<int>((k_end - k_begin + kBKFloat - 1) / kBKFloat);
    const std::int64_t k_first = k_end - std::int64_t(tiles) * kBKFloat;  // the ragged tile first
    std::int64_t offset[2];
    offsets_at(g.batch, z, offset);
    OperandCopies<kBM, a_k_fastest, kBlockThreads, float> a_copies(g.a.data + offset[0], g.a.ld, g.m, m0, k_first);
    OperandCopies<kBN, b_k_fastest, kBlockThreads, float> b_copies(g.b.data + offset[1], g.b.ld, g.n, n0, k_first);

    start_pipeline<kStages>(a_copies, b_copies, stage_a, stage_b, tiles, k_first, k_begin);

    Accumulators acc = {};
    int read = 0, write = kStages - 1, buf = 0;
    for (int left = tiles; left > 0; --left) {  // left: tiles from this one to the last
      wait_async_copies<kStages - 2>();  // this thread's copies of this tile have landed
      // Split into the tile the warps read two tiles ago, which the last barrier closed.
      split_own_chunks<kBM, a_k_fastest, 2>(a_copies, stage_a(read), split_a(buf));
      split_own_chunks<kBN, b_k_fastest, 1>(b_copies, stage_b(read), split_b(buf));
      // The stage split in the last step is this thread's alone to refill.
      if (left > kStages - 1) {
        a_copies.next(stage_a(write));
        b_copies.next(stage_b(write));
      }
      commit_async_copies();
      __syncthreads();  // every thread's split of this tile is in place
      multiply_tile<a_k_fastest, b_k_fastest>(acc, split_a(buf), split_b(buf), a_at, b_at);
      read = read + 1 == kStages ? 0 : read + 1;
      write = write + 1 == kStages ? 0 : write + 1;
      buf ^= 1;
    }
    wait_async_copies<0>();  // only empty groups remain
    __syncthreads();         // the next job's splits overwrite what the warps read last
    store_c<a_k_fastest>(acc, g, job, m0, n0, warp_m, warp_n, lane);
  }
}

}  // namespace

namespace gemm_detail {

std::int64_t sgemm_tf32_pipelined_splits(const GemmArgs& g, int sms) {
  return pipelined_splits<kBM, kBN, 4>(g, sms);  // four floats a 16-byte copy
}

void sgemm_tf32_pipelined(const GemmArgs& g, cudaStream_t stream) {
  const auto kernel = g.a.transposed ? (g.b.transposed ? sgemm_tf32_pipelined_kernel<true, true>
                                                       : sgemm_tf32_pipelined_kernel<true, false>)
                                     : (g.b.transposed ? sgemm_tf32_pipelined_kernel<false, true>
                                                       : sgemm_tf32_pipelined_kernel<false, false>);
  allow_shared_memory(kernel, kSharedBytes);
  launch(kernel, pipelined_grid(g, kBM, kBN), kBlockThreads, kSharedBytes, stream, g);
  CUDA_CHECK_LAUNCH();
}

}  // namespace gemm_detail

}  // namespace attograd::cuda
