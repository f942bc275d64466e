// SGEMM on the tensor cores: cuda/matmul.cu's tiling, double buffering and
// split-K (read it first), with every product a warp's mma.sync on TF32
// operands in float32 accuracy (3xTF32, cuda/mma.cuh).
//
// A block computes a BM x BN tile of C with warps of WM x WN each: WM / 16
// fragments of A (16 rows) against WN / 8 of B (8 columns) per step of 8 along
// K, three mma.sync each (small-big, big-small, big-big). The tiles stream
// through shared memory 16 deep (two mma steps), each thread fetching its share
// of the next into registers while the warps compute on this one.
//
// Shared memory holds each tile already split and in fragment order, so a lane
// reads its whole A fragment as two 128-bit loads (its four big parts, then its
// four small ones) and its B fragment as one ({big, big, small, small}); the 8
// lanes of each quarter-warp read 128 consecutive bytes, so no bank conflicts
// (fragment_slot permutes the lanes to spread the stores).
// The values are split once, when stored, not by every warp that reads them
// (each A fragment is read by BN / WN warps, each B fragment by BM / WM).
#include <cstdint>

#include "cuda/gemm_common.cuh"
#include "cuda/mma.cuh"

namespace attograd::cuda::gemm_detail {
namespace {

constexpr int kBK = 16;                // K per shared-memory tile
constexpr int kSteps = kBK / 8;        // mma steps per tile
constexpr int kAFragment = 2 * kWarp;  // float4s of one A fragment: 32 lanes' big parts, then their small ones

__host__ __device__ constexpr int a_tile_float4s(int bm) { return kSteps * (bm / 16) * kAFragment; }
__host__ __device__ constexpr int b_tile_float4s(int bn) { return kSteps * (bn / 8) * kWarp; }
constexpr std::size_t shared_bytes(int bm, int bn) {  // two of each tile
  return 2 * sizeof(float4) * (a_tile_float4s(bm) + b_tile_float4s(bn));
}

// Which float4 of a fragment lane `lane` reads: the lanes permuted within each
// group of 8, by the group and the fragment. A quarter-warp's 128-bit reads
// still cover 128 consecutive bytes, but the tile's scalar stores, whose 32
// threads hold one position of different rows or fragments, spread over the
// banks: 2- to 4-way conflicts where lanes in order had 8- to 32-way, counted
// for both tile sizes and every operand layout.
__device__ __forceinline__ int fragment_slot(int lane, int fragment) {
  return lane ^ (((lane >> 3) ^ (5 * fragment)) & 7);
}

// Where element (r, k) of an A tile goes (a float index, its big part; the
// small part is kWarp float4s on): mma.cuh's A layout, a[r / 8 + 2 (k / 4)] of
// lane 4 (r % 8) + k % 4, within fragment r / 16 of step k / 8.
template <int BM>
__device__ __forceinline__ int a_slot(int r, int k) {
  const int step = k / 8, kk = k % 8, fragment = r / 16, rr = r % 16;
  const int lane = (rr % 8) * 4 + kk % 4, value = rr / 8 + 2 * (kk / 4);
  return ((step * (BM / 16) + fragment) * kAFragment + fragment_slot(lane, fragment)) * 4 + value;
}
constexpr int kASmallOffset = kWarp * 4;

// Where element (k, n) of a B tile goes (big part; small part 2 floats on):
// b[k / 4] of lane 4 (n % 8) + k % 4, within fragment n / 8 of step k / 8.
template <int BN>
__device__ __forceinline__ int b_slot(int k, int n) {
  const int step = k / 8, kk = k % 8, fragment = n / 8;
  const int lane = (n % 8) * 4 + kk % 4;
  return ((step * (BN / 8) + fragment) * kWarp + fragment_slot(lane, fragment)) * 4 + kk / 4;
}
constexpr int kBSmallOffset = 2;

// Stores this thread's share of a tile (TileFetcher's: element (r, kk) is
// X(r0 + r, k0 + kk)) split in big and small TF32 parts at slot(r, kk).
template <int Rows, int Threads, typename Slot>
__device__ __forceinline__ void store_split(float* tile, const Staged<kStagedLoads<Rows, kBK, Threads>>& s,
                                            bool k_fastest, int small_offset, Slot slot) {
#pragma unroll
  for (int i = 0; i < kStagedLoads<Rows, kBK, Threads>; ++i) {
    if (!has_load<Rows, kBK, Threads, float>(i)) break;
    const auto [kk0, r0] = load_at<Rows, kBK, Threads, float>(i, k_fastest);
    float x[4];
    unpack4(s.v[i], x);
#pragma unroll
    for (int t = 0; t < 4; ++t) {  // four consecutive k, or four consecutive rows
      const int at = k_fastest ? slot(r0, kk0 + t) : slot(r0 + t, kk0);
      tile[at] = bits_float(tf32_big(x[t]));
      tile[at + small_offset] = bits_float(tf32_small(x[t]));
    }
  }
}

template <int BM, int BN, int WM, int WN, bool SplitK>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * kWarp) sgemm_tc_kernel(GemmArgs g) {
  constexpr int kWarpsN = BN / WN, kBlockThreads = kWarp * (BM / WM) * kWarpsN;
  constexpr int FM = WM / 16, FN = WN / 8;  // a warp's A and B fragments per mma step
  // Buffer `buf` of each: A's two tiles, then B's two.
  float4* const smem = dynamic_shared_memory<float4>();
  const auto a_tile = [smem](int buf) { return smem + buf * a_tile_float4s(BM); };
  const auto b_tile = [smem](int buf) { return smem + 2 * a_tile_float4s(BM) + buf * b_tile_float4s(BN); };
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  const std::int64_t m0 = std::int64_t(blockIdx.y) * BM, n0 = std::int64_t(blockIdx.x) * BN;
  using Acc = float[FM][FN][4];  // mma.cuh's C fragments of the warp's 16 x 8 tiles

  const auto store = [&](int buf, const auto& a, bool a_k_fastest, const auto& b, bool b_k_fastest) {
    store_split<BM, kBlockThreads>(&a_tile(buf)->x, a, a_k_fastest, kASmallOffset,
                                   [](int r, int k) { return a_slot<BM>(r, k); });
    store_split<BN, kBlockThreads>(&b_tile(buf)->x, b, b_k_fastest, kBSmallOffset,
                                   [](int n, int k) { return b_slot<BN>(k, n); });  // B's tile comes as B^T
  };
  const auto compute = [&](Acc& acc, int buf) {
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      SplitFragment<2> b[FN];
#pragma unroll
      for (int j = 0; j < FN; ++j) {
        const int fragment = warp_n * FN + j;
        const float4 v = b_tile(buf)[(step * (BN / 8) + fragment) * kWarp + fragment_slot(lane, fragment)];
        b[j] = {{float_bits(v.x), float_bits(v.y)}, {float_bits(v.z), float_bits(v.w)}};
      }
#pragma unroll
      for (int i = 0; i < FM; ++i) {
        const int fragment = warp_m * FM + i;
        const float4* mine = a_tile(buf) + (step * (BM / 16) + fragment) * kAFragment + fragment_slot(lane, fragment);
        const float4 big = mine[0], small = mine[kWarp];
        const SplitFragment<4> a{{float_bits(big.x), float_bits(big.y), float_bits(big.z), float_bits(big.w)},
                                 {float_bits(small.x), float_bits(small.y), float_bits(small.z), float_bits(small.w)}};
#pragma unroll
        for (int j = 0; j < FN; ++j) mma_3xtf32(acc[i][j], a, b[j]);
      }
    }
  };
  // Lane (g, t) holds rows g and g + 8 of each 16 x 8 tile, columns 2t and 2t + 1.
  const auto finish = [&](const Acc& acc, std::int64_t job) {
    float* const C = g.c + job * g.m * g.n;
    const int row_in_tile = lane / 4, column_in_tile = 2 * (lane % 4);
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const std::int64_t gm = m0 + warp_m * WM + i * 16 + half * 8 + row_in_tile;
        if (gm >= g.m) continue;
        float* row = C + gm * g.n;
#pragma unroll
        for (int j = 0; j < FN; ++j) {
          const std::int64_t gn = n0 + warp_n * WN + j * 8 + column_in_tile;
          const float c0 = acc[i][j][2 * half], c1 = acc[i][j][2 * half + 1];
          if (g.c_vec &&
              gn + 2 <= g.n) {  // c_vec: C 16-byte aligned and N a multiple of 4, so gn * 4 bytes is 8-aligned
            *reinterpret_cast<float2*>(row + gn) = make_float2(with_bias(g, c0, gn), with_bias(g, c1, gn + 1));
          } else {
            if (gn < g.n) row[gn] = with_bias(g, c0, gn);
            if (gn + 1 < g.n) row[gn + 1] = with_bias(g, c1, gn + 1);
          }
        }
      }
  };
  gemm_jobs<BM, BN, kBK, kBlockThreads, SplitK, Acc>(g, store, compute, finish, !g.a.transposed, g.b.transposed);
}

template <int BM, int BN, int WM, int WN, bool SplitK>
void launch_sgemm_tc(const GemmArgs& g, cudaStream_t stream) {
  constexpr std::size_t smem = shared_bytes(BM, BN);
  allow_shared_memory(sgemm_tc_kernel<BM, BN, WM, WN, SplitK>, smem);
  launch(sgemm_tc_kernel<BM, BN, WM, WN, SplitK>, gemm_grid(g, BM, BN), kWarp * (BM / WM) * (BN / WN), smem, stream, g);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

// 128 x 128 tiles of 8 warps (64 x 32 each), 64 KB of shared memory; 64 x 64
// tiles of 4 warps (32 x 32 each), 32 KB.
const GemmKernels& tensor_core_gemm_kernels() {
  static constexpr GemmKernels kernels{launch_sgemm_tc<128, 128, 64, 32, false>, launch_sgemm_tc<64, 64, 32, 32, false>,
                                       launch_sgemm_tc<64, 64, 32, 32, true>, kBK};
  return kernels;
}

}  // namespace attograd::cuda::gemm_detail
