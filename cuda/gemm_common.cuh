#pragma once
// What the matrix products share (cuda/matmul.cu's SGEMM on the CUDA cores,
// cuda/matmul_tensor_core.cu's on the tensor cores, cuda/matmul_bf16.cu's
// bfloat16 product): the problem as a kernel sees it, loading a tile of either
// operand (float32, or bfloat16 bits) from global memory, in either layout,
// into registers, the job loop around their own products (gemm_jobs), split-K's
// choice of slices and the sum of their partial products, and how
// cuda/matmul.cu's sgemm reaches a set's kernels. Included by those three files only.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "base/error.h"
#include "cuda/device_utils.cuh"
#include "cuda/launchers.h"

namespace attograd::cuda::gemm_detail {

struct GemmArgs {
  GemmOperand a, b;
  float* c;
  std::int64_t m, n, k, batches;
  StridedLayout<2> batch;
  bool a_vec, b_vec, c_vec;  // float4 access allowed (alignment holds for every batch)
  // K in `splits` slices of k_slice (a multiple of BK, so no tile straddles two slices):
  // slice s of batch z writes the m x n matrix c + (z * splits + s) * m * n.
  std::int64_t splits = 1, k_slice = 0;
  // n values added to C's rows as it is stored (never to a slice's partial
  // product; the pipelined float32 kernel takes none: sgemm adds it after).
  const float* bias = nullptr;
};

// C's value at column `col` (below n) as stored: the float32 sum, plus the bias where there is one.
__device__ __forceinline__ float with_bias(const GemmArgs& g, float sum, std::int64_t col) {
  return g.bias ? sum + g.bias[col] : sum;
}

// What the pipelined bfloat16 product does to C as it leaves, each value from
// C rounded to bfloat16 and computed in float32 as the element-wise kernels
// do (cuda/gelu.cuh), then rounded once: the composed ops' bits.
enum class Bf16Epilogue {
  none,       // C = A B (+ bias)
  gelu,       // C = A B + bias, and act = gelu(C): linear_gelu
  gelu_grad,  // C = (A B) gelu'(pre): matmul_gelu_grad
};

// The bfloat16 product's (cuda/matmul_bf16.cu): C rounded to bfloat16 with
// the bias added, or with splits the float32 partial products, slice s of
// batch z the m x n matrix partial + (z * splits + s) * m * n.
struct Bf16GemmArgs {
  Bf16GemmOperand a, b;
  bfloat16* c;
  const bfloat16* bias;  // n values, or null
  std::int64_t m, n, k, batches;
  StridedLayout<2> batch;
  bool a_vec, b_vec;  // 16-byte loads allowed (alignment holds for every batch)
  std::int64_t splits = 1, k_slice = 0;
  float* partial = nullptr;
  Bf16Epilogue epilogue = Bf16Epilogue::none;  // gemm_bf16_pipelined_epilogue's alone
  bfloat16* act = nullptr;                     // gelu: m x n, as C
  const bfloat16* pre = nullptr;               // gelu_grad: m x n, as C
};

// A tile's elements as loaded: float32 values, or bfloat16 bits; a 16-byte
// load is kPerLoad of them, a float4 or a uint4.
__device__ __forceinline__ const float* tile_elements(const float* p) { return p; }
__device__ __forceinline__ const std::uint16_t* tile_elements(const bfloat16* p) {
  return reinterpret_cast<const std::uint16_t*>(p);
}
template <typename E>
constexpr int kPerLoad = 16 / static_cast<int>(sizeof(E));
template <typename E>
using Load16 = std::conditional_t<std::is_same_v<E, float>, float4, uint4>;

// Elements p[i], ..., p[i + 3] of which the first `valid` (0 to 4) lie inside
// the matrix: one float4 load when allowed and all four are inside, else
// scalar loads, zero past the edge.
__device__ __forceinline__ float4 load16(const float* p, std::int64_t i, std::int64_t valid, bool vec) {
  if (vec && valid == 4) return *reinterpret_cast<const float4*>(p + i);
  float v[4];
#pragma unroll
  for (int t = 0; t < 4; ++t) v[t] = t < valid ? p[i + t] : 0.0f;
  return make_float4(v[0], v[1], v[2], v[3]);
}

// The same for eight bfloat16 values (bits), p[i] in the low half of the first word.
__device__ __forceinline__ uint4 load16(const std::uint16_t* p, std::int64_t i, std::int64_t valid, bool vec) {
  if (vec && valid == 8) return *reinterpret_cast<const uint4*>(p + i);
  std::uint32_t w[4];
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const std::uint32_t lo = 2 * t < valid ? p[i + 2 * t] : 0u, hi = 2 * t + 1 < valid ? p[i + 2 * t + 1] : 0u;
    w[t] = lo | (hi << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ void unpack4(float4 v, float* out) {
  out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
}

// How many of Width consecutive indices from `start` are below `end` (0 to Width).
template <int Width>
__device__ __forceinline__ std::int64_t in_range(std::int64_t start, std::int64_t end) {
  return end - start >= Width ? Width : (end > start ? end - start : 0);
}

// A thread's share of loading one tile: the float4s it fetches from global
// memory into registers, where they wait while the block computes on the
// previous tile, and then stores into shared memory.
template <int Count, typename E = float>
struct Staged {
  Load16<E> v[Count];
};
template <int Rows, int BK, int Threads, typename E = float>
constexpr int kStagedLoads = (Rows * BK / kPerLoad<E> + Threads - 1) / Threads;

// One operand's tile seen as Rows x BK: element (r, kk) is X(r0 + r, k0 + kk),
// X being A (rows m) or B transposed (rows n). In memory either k runs fastest
// (A row-major, B transposed) or the rows do, and a 16-byte load holds
// kPerLoad consecutive elements of whichever that is.
template <typename E>
struct TileSourceOf {
  const E* data;
  std::int64_t ld, rows, k;
  bool k_fastest, vec;
};

// Where load i of this thread lies in its tile: {kk, rr}, the first of its kPerLoad elements
// (consecutive k where k runs fastest in memory, else consecutive rows). Consecutive threads
// take consecutive loads of one row (k fastest) or of one k, so a warp reads whole runs of
// memory; the stores into shared memory (each kernel set's own) read the same places from here.
struct TileLoadAt {
  int kk, rr;
};
template <int Rows, int BK, int Threads, typename E>
__device__ __forceinline__ TileLoadAt load_at(int i, bool k_fastest) {
  constexpr int W = kPerLoad<E>;
  const int v = threadIdx.x + i * Threads;
  if (k_fastest) return {(v % (BK / W)) * W, v / (BK / W)};
  return {v / (Rows / W), (v % (Rows / W)) * W};
}

// Whether this thread has a load i in a tile: the last may be partly unused
// where the tile's loads are not a whole number per thread.
template <int Rows, int BK, int Threads, typename E>
__device__ __forceinline__ bool has_load(int i) {
  constexpr int kLoads = Rows * BK / kPerLoad<E>;
  return kLoads % Threads == 0 || static_cast<int>(threadIdx.x) + i * Threads < kLoads;
}

// This thread's share of the operand's tiles of one job, zero outside the
// matrix. Where each of its loads lies from a tile's first element is the same
// for every tile of the job, so it is worked out once; a tile wholly inside a
// matrix that allows 16-byte loads (most of them, in a large product) is then
// one address and a load each, without a bound to check: one branch a tile,
// where each load's checks and 64-bit index products had cost several
// instructions in the products' main loop.
template <int Rows, int BK, int Threads, typename E>
struct TileFetcher {
  static constexpr int kLoads = kStagedLoads<Rows, BK, Threads, E>, W = kPerLoad<E>;
  static_assert(Rows % W == 0 && BK % W == 0, "a load is W consecutive rows or k");
  TileSourceOf<E> x;
  std::int64_t row_step, k_step;  // X(r, k) = data[r * row_step + k * k_step]
  std::int64_t offset[kLoads];    // load i's first element from the tile's

  __device__ __forceinline__ explicit TileFetcher(const TileSourceOf<E>& source)
      : x(source), row_step(source.k_fastest ? source.ld : 1), k_step(source.k_fastest ? 1 : source.ld) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const auto [kk, rr] = load_at<Rows, BK, Threads, E>(i, x.k_fastest);
      offset[i] = rr * row_step + kk * k_step;
    }
  }

  // The tile at (r0, k0) into s.
  __device__ __forceinline__ void fetch(Staged<kLoads, E>& s, std::int64_t r0, std::int64_t k0) const {
    const E* tile = x.data + r0 * row_step + k0 * k_step;
    if (x.vec && r0 + Rows <= x.rows && k0 + BK <= x.k) {
#pragma unroll
      for (int i = 0; i < kLoads; ++i)
        if (has_load<Rows, BK, Threads, E>(i)) s.v[i] = *reinterpret_cast<const Load16<E>*>(tile + offset[i]);
      return;
    }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      if (!has_load<Rows, BK, Threads, E>(i)) break;
      const auto [kk, rr] = load_at<Rows, BK, Threads, E>(i, x.k_fastest);
      const std::int64_t gr = r0 + rr, gk = k0 + kk;
      const std::int64_t valid = x.k_fastest ? (gr < x.rows ? in_range<W>(gk, x.k) : 0)
                                             : (gk < x.k ? in_range<W>(gr, x.rows) : 0);
      s.v[i] = load16(tile, offset[i], valid, x.vec);
    }
  }
};

// The loop both kernel sets run. For each of the block's jobs (a batch, and a
// slice of K when SplitK) the A and B tiles along K are double buffered: each
// thread fetches its share of the next pair into registers while
// compute(acc, buf) works on shared-memory buffer buf, and
// store(buf ^ 1, a, a_k_fastest, b, b_k_fastest) then puts them in the other
// (the pair at k0 = 0 goes into buffer 0 first). finish(acc, job) writes the
// job's results (job = z * splits + slice). acc is an Acc, zeroed for each job.
// a_k_fastest and b_k_fastest are !g.a.transposed and g.b.transposed, which a
// kernel made for one pair of layouts passes as constants.
template <int BM, int BN, int BK, int Threads, bool SplitK, typename Acc, typename Args, typename Store,
          typename Compute, typename Finish>
__device__ __forceinline__ void gemm_jobs(const Args& g, Store store, Compute compute, Finish finish,
                                          bool a_k_fastest, bool b_k_fastest) {
  using E = std::remove_const_t<std::remove_pointer_t<decltype(tile_elements(g.a.data))>>;
  const std::int64_t m0 = std::int64_t(blockIdx.y) * BM, n0 = std::int64_t(blockIdx.x) * BN;
  const std::int64_t splits = SplitK ? g.splits : 1;
  for (std::int64_t job = blockIdx.z; job < g.batches * splits; job += gridDim.z) {
    const std::int64_t z = SplitK ? job / splits : job;
    const std::int64_t k_begin = SplitK ? (job % splits) * g.k_slice : 0;
    const std::int64_t k_end = SplitK ? min(g.k, k_begin + g.k_slice) : g.k;
    std::int64_t offset[2];
    offsets_at(g.batch, z, offset);
    const TileFetcher<BM, BK, Threads, E> a_source(
        {tile_elements(g.a.data) + offset[0], g.a.ld, g.m, g.k, a_k_fastest, g.a_vec});
    const TileFetcher<BN, BK, Threads, E> b_source(
        {tile_elements(g.b.data) + offset[1], g.b.ld, g.n, g.k, b_k_fastest, g.b_vec});  // B seen as B^T
    Acc acc{};

    // Zeroed: a thread with no load in a tile (has_load) stores nothing, but g++ cannot tell.
    Staged<kStagedLoads<BM, BK, Threads, E>, E> a_next{}, b_next{};
    a_source.fetch(a_next, m0, k_begin);
    b_source.fetch(b_next, n0, k_begin);
    store(0, a_next, a_k_fastest, b_next, b_k_fastest);
    __syncthreads();
    int buf = 0;
    for (std::int64_t k0 = k_begin; k0 < k_end; k0 += BK) {
      const bool more = k0 + BK < k_end;
      if (more) {  // in flight while the products below run
        a_source.fetch(a_next, m0, k0 + BK);
        b_source.fetch(b_next, n0, k0 + BK);
      }
      compute(acc, buf);
      // The other buffer was last read in the previous step, which the barrier below it closed.
      if (more) store(buf ^ 1, a_next, a_k_fastest, b_next, b_k_fastest);
      __syncthreads();  // the next tile is stored, and everyone is done reading this one
      buf ^= 1;
    }
    finish(acc, job);
  }
}

// The kernels of one set at its two tile sizes, as cuda/matmul.cu's sgemm picks
// them: 128 x 128 tiles over all of K, and 64 x 64 tiles over all of K or
// (split) over g.splits slices of g.k_slice, each a multiple of `bk`.
struct GemmKernels {
  void (*big)(const GemmArgs&, cudaStream_t);
  void (*small)(const GemmArgs&, cudaStream_t);
  void (*small_split)(const GemmArgs&, cudaStream_t);
  std::int64_t bk;
};
const GemmKernels& tensor_core_gemm_kernels();  // cuda/matmul_tensor_core.cu

// The pipelined bfloat16 product (cuda/matmul_bf16_pipelined.cu): on a GPU
// of `sms` multiprocessors, 0 where g does not suit it, else the slices of K
// to cut it into (1: none); and its launch (with g.splits slices of g.k_slice,
// the float32 partial products into g.partial, which sum_slices adds).
std::int64_t gemm_bf16_pipelined_splits(const Bf16GemmArgs& g, int sms);
void gemm_bf16_pipelined(const Bf16GemmArgs& g, cudaStream_t stream);
// Its kernels with an epilogue (g.epilogue, one job, no splits) are made for
// the MLP's layouts (A as it is; B transposed for gelu, as it is for
// gelu_grad): whether g has one, and the launch, false (launching nothing) for the others.
bool gemm_bf16_pipelined_epilogue_layout(const Bf16GemmArgs& g);
bool gemm_bf16_pipelined_epilogue(const Bf16GemmArgs& g, cudaStream_t stream);

// The sm_90a product (cuda/matmul_bf16_wgmma.cu), for what the pipelined kernel
// takes (any layout, whole or in slices of K; an epilogue in its layout, whole):
// whether it has a kernel for g, and the launch.
bool gemm_bf16_wgmma_takes(const Bf16GemmArgs& g);
void gemm_bf16_wgmma(const Bf16GemmArgs& g, cudaStream_t stream);
// Its kernel fed by TMA (cuda/matmul_bf16_wgmma_tma.cu), for what gemm_bf16_wgmma
// takes: the launch where TMA can copy g's tiles, false (launching nothing) elsewhere.
bool gemm_bf16_wgmma_tma(const Bf16GemmArgs& g, cudaStream_t stream);

// The same for float32 on the tensor cores (cuda/matmul_tf32_pipelined.cu);
// with splits, slice s of batch z writes the m x n matrix g.c + (z * splits + s) * m * n.
std::int64_t sgemm_tf32_pipelined_splits(const GemmArgs& g, int sms);
void sgemm_tf32_pipelined(const GemmArgs& g, cudaStream_t stream);

// The grid of a launch with BM x BN tiles: x over N's tiles, y over M's, z over
// the jobs (batches, times slices of K).
inline dim3 gemm_grid(std::int64_t m, std::int64_t n, std::int64_t jobs, int bm, int bn) {
  const std::int64_t grid_m = (m + bm - 1) / bm, grid_n = (n + bn - 1) / bn;
  AG_CHECK(grid_m <= 65535, "matmul", "M = {} is too large for the CUDA kernel (at most {})", m, 65535 * bm);
  return dim3(static_cast<unsigned>(grid_n), static_cast<unsigned>(grid_m),
              static_cast<unsigned>(std::min<std::int64_t>(jobs, 65535)));
}
template <typename Args>
dim3 gemm_grid(const Args& g, int bm, int bn) {
  return gemm_grid(g.m, g.n, g.batches * g.splits, bm, bn);
}

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// 16-byte loads of an operand (four floats, eight bfloat16) stay aligned in
// every batch when its base, its ld and each of its batch strides are
// multiples of one load's values.
template <typename T>
bool vector_ok(const MatrixOperandOf<T>& x, const StridedLayout<2>& batch, int operand) {
  constexpr std::int64_t kPerLoad = 16 / sizeof(T);
  if (!aligned16(x.data) || x.ld % kPerLoad != 0) return false;
  for (int d = 0; d < batch.ndim; ++d)
    if (batch.strides[operand][d] % kPerLoad != 0) return false;
  return true;
}

// The current device's streaming multiprocessors, which the tile sizes are chosen to fill.
inline int multiprocessors() {
  int device = 0, count = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

// ---- split-K -------------------------------------------------------------------------------

// How many slices of K the 64 x 64 kernels should take over `tiles` output
// tiles: enough for about two blocks per SM, each slice at least kMinSliceK
// long (shorter slices would cost more in scratch traffic than they gain), at
// most kMaxSplits (bounding scratch memory at kMaxSplits times C).
inline std::int64_t k_splits(std::int64_t tiles, std::int64_t k, int sms) {
  constexpr std::int64_t kMinSliceK = 256, kMaxSplits = 16;
  if (tiles >= sms) return 1;
  return std::max<std::int64_t>(1, std::min({(2 * sms + tiles - 1) / tiles, k / kMinSliceK, kMaxSplits}));
}

// The pipelined products' choice (cuda/matmul_bf16_pipelined.cu, and
// matmul_tf32_pipelined.cu): BM x BN tiles copied 16 bytes at a time,
// ChunkValues values a copy. 0 where g does not suit them, else the slices of
// K to cut it into (1: none) on a GPU of `sms` multiprocessors.
template <int BM, int BN, int ChunkValues, typename Args>
std::int64_t pipelined_splits(const Args& g, int sms) {
  // 16-byte copies need aligned operands, and each copy's values wholly inside
  // the matrix or wholly outside: K a multiple of ChunkValues where an operand
  // has k fastest (A as it is, B transposed), its rows (M, N) where it has not.
  const bool a_whole = g.a.transposed ? g.m % ChunkValues == 0 : g.k % ChunkValues == 0;
  const bool b_whole = g.b.transposed ? g.k % ChunkValues == 0 : g.n % ChunkValues == 0;
  if (g.k == 0 || !g.a_vec || !g.b_vec || !a_whole || !b_whole) return 0;
  // Enough tiles for every SM, or slices of a long K to make up for too few.
  const std::int64_t tiles = ((g.m + BM - 1) / BM) * ((g.n + BN - 1) / BN) * g.batches;
  if (tiles >= sms) return 1;
  const std::int64_t splits = k_splits(tiles, g.k, sms);
  return splits > 1 ? splits : 0;
}

// Their grid: x over C's BM x BN tiles (the kernel orders them, raster_tile),
// z over the jobs (batches, times slices of K).
template <typename Args>
dim3 pipelined_grid(const Args& g, int bm, int bn) {
  const std::int64_t tiles = ((g.m + bm - 1) / bm) * ((g.n + bn - 1) / bn);
  AG_CHECK(tiles <= 0x7fffffff, "matmul", "{} x {} is too large for the CUDA kernel", g.m, g.n);
  return dim3(static_cast<unsigned>(tiles), 1,
              static_cast<unsigned>(std::min<std::int64_t>(g.batches * g.splits, 65535)));
}

// g cut into about `splits` slices of K, each a whole number of bk (rounding
// the slice up may leave fewer slices, none empty).
template <typename Args>
void slice_k(Args& g, std::int64_t splits, std::int64_t bk) {
  g.k_slice = ((g.k + splits - 1) / splits + bk - 1) / bk * bk;
  g.splits = (g.k + g.k_slice - 1) / g.k_slice;
}

// c[z] = the sum of partial[z][0 .. splits-1], added in slice order, plus
// bias[column] where there is one, stored as T (one rounding for bfloat16).
template <typename T>
__global__ void sum_slices_kernel(T* c, const float* partial, const T* bias, std::int64_t n, std::int64_t mn,
                                  std::int64_t batches, std::int64_t splits) {
  for (std::int64_t e = global_thread(); e < batches * mn; e += grid_threads()) {
    const float* p = partial + (e / mn) * splits * mn + e % mn;
    float sum = p[0];
    for (std::int64_t s = 1; s < splits; ++s) sum += p[s * mn];
    c[e] = T(bias ? sum + static_cast<float>(bias[e % n]) : sum);
  }
}

template <typename T>
void sum_slices(T* c, const float* partial, const T* bias, std::int64_t m, std::int64_t n, std::int64_t batches,
                std::int64_t splits, cudaStream_t stream) {
  launch(sum_slices_kernel<T>, grid_for(batches * m * n), kThreads, 0, stream, c, partial, bias, n, m * n, batches,
         splits);
  CUDA_CHECK_LAUNCH();
}

}  // namespace attograd::cuda::gemm_detail
