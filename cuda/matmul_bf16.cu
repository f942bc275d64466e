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
// The tiles are double buffered as in cuda/matmul.cu: each thread fetches its
// share of the next pair into registers (8 values, 16 bytes, at a time) while
// the warps compute on this one.
//
// Operands come in either layout: where a row's k values lie side by side in
// memory (A row-major, B transposed) a fetch is eight k of one row, stored as
// one 16-byte write; otherwise eight rows of one k, stored value by value.
//
// Not here yet (float32's sgemm has them): split-K for few output tiles over
// a long K, and a measured choice of tile sizes (no GPU has run this yet).
#include <cstdint>

#include "cuda/gemm_common.cuh"
#include "cuda/mma_bf16.cuh"

namespace attograd::cuda {
namespace {

using gemm_detail::gemm_grid;
using gemm_detail::in_range;
using gemm_detail::vector_ok;

constexpr int kBK = 32;                // K per shared-memory tile: two mma steps
constexpr int kRowStride = kBK + 8;    // values per tile row, padded (see above)
constexpr int kChunk = 8;              // values per fetch: 16 bytes

struct Bf16GemmArgs {
  Bf16GemmOperand a, b;
  bfloat16* c;
  const bfloat16* bias;  // n values, or null
  std::int64_t m, n, k, batches;
  StridedLayout<2> batch;
  bool a_vec, b_vec;  // 16-byte loads allowed (alignment holds for every batch)
};

// One operand's tile seen as Rows x kBK: element (r, kk) is X(r0 + r, k0 + kk),
// X being A (rows m) or B transposed (rows n); k runs fastest in memory, or the rows do.
struct Bf16TileSource {
  const std::uint16_t* data;
  std::int64_t ld, rows, k;
  bool k_fastest, vec;
};

template <int Rows, int Threads>
constexpr int kFetches = (Rows * kBK / kChunk + Threads - 1) / Threads;

template <int Rows, int Threads>
struct Fetched {
  uint4 v[kFetches<Rows, Threads>];
};

// Values p[i], ..., p[i + 7] of which the first `valid` lie inside the matrix:
// one 16-byte load when allowed and all eight are inside, else value by value,
// zero past the edge.
__device__ __forceinline__ uint4 load8(const std::uint16_t* p, std::int64_t i, std::int64_t valid, bool vec) {
  if (vec && valid == kChunk) return *reinterpret_cast<const uint4*>(p + i);
  std::uint16_t v[kChunk];
#pragma unroll
  for (int t = 0; t < kChunk; ++t) v[t] = t < valid ? p[i + t] : std::uint16_t{0};
  return make_uint4(bf16_pair(v[0], v[1]), bf16_pair(v[2], v[3]), bf16_pair(v[4], v[5]), bf16_pair(v[6], v[7]));
}

// This thread's share of the tile at (r0, k0), zero outside the matrix.
template <int Rows, int Threads>
__device__ __forceinline__ void fetch(Fetched<Rows, Threads>& f, const Bf16TileSource& x, std::int64_t r0,
                                      std::int64_t k0) {
#pragma unroll
  for (int i = 0; i < kFetches<Rows, Threads>; ++i) {
    const int v = threadIdx.x + i * Threads;
    if (v >= Rows * kBK / kChunk) break;
    if (x.k_fastest) {  // X(r, k) = data[r * ld + k]: eight consecutive k
      const int rr = v / (kBK / kChunk), kk = (v % (kBK / kChunk)) * kChunk;
      const std::int64_t gr = r0 + rr, gk = k0 + kk;
      f.v[i] = load8(x.data, gr * x.ld + gk, gr < x.rows ? in_range<kChunk>(gk, x.k) : 0, x.vec);
    } else {  // X(r, k) = data[k * ld + r]: eight consecutive rows
      const int kk = v / (Rows / kChunk), rr = (v % (Rows / kChunk)) * kChunk;
      const std::int64_t gr = r0 + rr, gk = k0 + kk;
      f.v[i] = load8(x.data, gk * x.ld + gr, gk < x.k ? in_range<kChunk>(gr, x.rows) : 0, x.vec);
    }
  }
}

// tile[r * kRowStride + kk] = X(r0 + r, k0 + kk), from fetch's share.
template <int Rows, int Threads>
__device__ __forceinline__ void store(std::uint16_t* tile, const Fetched<Rows, Threads>& f, bool k_fastest) {
#pragma unroll
  for (int i = 0; i < kFetches<Rows, Threads>; ++i) {
    const int v = threadIdx.x + i * Threads;
    if (v >= Rows * kBK / kChunk) break;
    if (k_fastest) {
      const int rr = v / (kBK / kChunk), kk = (v % (kBK / kChunk)) * kChunk;
      *reinterpret_cast<uint4*>(tile + rr * kRowStride + kk) = f.v[i];
    } else {
      const int kk = v / (Rows / kChunk), rr = (v % (Rows / kChunk)) * kChunk;
      const std::uint32_t pairs[4] = {f.v[i].x, f.v[i].y, f.v[i].z, f.v[i].w};
#pragma unroll
      for (int t = 0; t < kChunk; ++t)
        tile[(rr + t) * kRowStride + kk] = static_cast<std::uint16_t>(t % 2 ? pairs[t / 2] >> 16 : pairs[t / 2]);
    }
  }
}

__device__ __forceinline__ std::uint32_t pair_at(const std::uint16_t* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}

template <int BM, int BN, int WM, int WN>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * kWarp) gemm_bf16_kernel(Bf16GemmArgs g) {
  constexpr int kWarpsN = BN / WN, kBlockThreads = kWarp * (BM / WM) * kWarpsN;
  constexpr int FM = WM / 16, FN = WN / 8;  // a warp's A and B fragments per mma step
  static_assert(BM % kChunk == 0 && BN % kChunk == 0, "a fetch of rows-fastest operands is eight rows");
  // Two of each tile: the warps compute on one while the next is stored into the other.
  __shared__ __align__(16) std::uint16_t a_tiles[2][BM * kRowStride];
  __shared__ __align__(16) std::uint16_t b_tiles[2][BN * kRowStride];  // B^T: row n holds B(k0.., n)
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  const int g_lane = lane / 4, t_lane = lane % 4;
  const std::int64_t m0 = std::int64_t(blockIdx.y) * BM, n0 = std::int64_t(blockIdx.x) * BN;

  for (std::int64_t z = blockIdx.z; z < g.batches; z += gridDim.z) {
    std::int64_t offset[2];
    offsets_at(g.batch, z, offset);
    const auto bits = [](const bfloat16* p) { return reinterpret_cast<const std::uint16_t*>(p); };
    const Bf16TileSource a{bits(g.a.data) + offset[0], g.a.ld, g.m, g.k, !g.a.transposed, g.a_vec};
    const Bf16TileSource b{bits(g.b.data) + offset[1], g.b.ld, g.n, g.k, g.b.transposed, g.b_vec};  // B^T
    float acc[FM][FN][4] = {};

    Fetched<BM, kBlockThreads> a_next;
    Fetched<BN, kBlockThreads> b_next;
    fetch(a_next, a, m0, 0);
    fetch(b_next, b, n0, 0);
    store(a_tiles[0], a_next, a.k_fastest);
    store(b_tiles[0], b_next, b.k_fastest);
    __syncthreads();
    int buf = 0;
    for (std::int64_t k0 = 0; k0 < g.k; k0 += kBK) {
      const bool more = k0 + kBK < g.k;
      if (more) {  // in flight while the products below run
        fetch(a_next, a, m0, k0 + kBK);
        fetch(b_next, b, n0, k0 + kBK);
      }
#pragma unroll
      for (int step = 0; step < kBK / 16; ++step) {
        const int k_lane = step * 16 + 2 * t_lane;  // this lane's first k in each register
        std::uint32_t b_frag[FN][2];
#pragma unroll
        for (int j = 0; j < FN; ++j) {
          const std::uint16_t* row = b_tiles[buf] + (warp_n * WN + j * 8 + g_lane) * kRowStride + k_lane;
          b_frag[j][0] = pair_at(row), b_frag[j][1] = pair_at(row + 8);
        }
#pragma unroll
        for (int i = 0; i < FM; ++i) {
          const std::uint16_t* top = a_tiles[buf] + (warp_m * WM + i * 16 + g_lane) * kRowStride + k_lane;
          const std::uint16_t* bottom = top + 8 * kRowStride;
          const std::uint32_t a_frag[4] = {pair_at(top), pair_at(bottom), pair_at(top + 8), pair_at(bottom + 8)};
#pragma unroll
          for (int j = 0; j < FN; ++j) mma_bf16(acc[i][j], a_frag, b_frag[j]);
        }
      }
      // The other buffer was last read in the previous step, which the barrier below it closed.
      if (more) {
        store(a_tiles[buf ^ 1], a_next, a.k_fastest);
        store(b_tiles[buf ^ 1], b_next, b.k_fastest);
      }
      __syncthreads();  // the next tile is stored, and everyone is done reading this one
      buf ^= 1;
    }

    // Lane (g, t) holds rows g and g + 8 of each 16 x 8 tile, columns 2t and 2t + 1.
    bfloat16* const c = g.c + z * g.m * g.n;
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
            const float bias = g.bias ? static_cast<float>(g.bias[gn]) : 0.0f;
            c[gm * g.n + gn] = bfloat16(acc[i][j][2 * half + col] + bias);
          }
      }
  }
}

template <int BM, int BN, int WM, int WN>
void launch_gemm_bf16(const Bf16GemmArgs& g, cudaStream_t stream) {
  launch(gemm_bf16_kernel<BM, BN, WM, WN>, gemm_grid(g.m, g.n, g.batches, BM, BN), kWarp * (BM / WM) * (BN / WN), 0,
         stream, g);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void gemm_bf16(bfloat16* c, Bf16GemmOperand a, Bf16GemmOperand b, const bfloat16* bias, std::int64_t m,
               std::int64_t n, std::int64_t k, const StridedLayout<2>& batch, cudaStream_t stream) {
  if (m == 0 || n == 0 || batch.numel == 0) return;
  // K = 0 needs nothing apart: the loop over K is empty and C is the bias, or zero.
  const Bf16GemmArgs g{a, b, c, bias, m, n, k, batch.numel, batch, vector_ok(a, batch, 0), vector_ok(b, batch, 1)};
  // 128 x 128 tiles of 8 warps (64 x 32 each) reuse each loaded value most;
  // where they would leave SMs idle, 64 x 64 tiles of 4 warps (32 x 32 each).
  const std::int64_t big_tiles = ((m + 127) / 128) * ((n + 127) / 128) * batch.numel;
  if (big_tiles >= 2 * gemm_detail::multiprocessors()) return launch_gemm_bf16<128, 128, 64, 32>(g, stream);
  launch_gemm_bf16<64, 64, 32, 32>(g, stream);
}

}  // namespace attograd::cuda
