#pragma once
// What the kernels share: launch shapes, warp and row reductions, and math
// functions chosen by element type. Included by cuda/*.cu only.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cuda/check.h"

namespace attograd::cuda {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 256;  // block size of the grid-stride kernels

// Blocks for a grid-stride loop over n items: one item per thread up to a cap,
// beyond which each thread loops (the cap keeps every GPU busy and well inside
// the grid limits).
inline unsigned grid_for(std::int64_t n, int threads = kThreads) {
  constexpr std::int64_t kMaxBlocks = 32768;
  return static_cast<unsigned>(std::clamp<std::int64_t>((n + threads - 1) / threads, 1, kMaxBlocks));
}

// kernel<<<grid, block, dynamic_smem, stream>>>(args...): every launch goes
// through here, so the emulated build (cmake -DATTOGRAD_CUDA=EMULATE, see
// tests/cuda_emulator/) can run the same kernels on the CPU. The caller checks
// the launch with CUDA_CHECK_LAUNCH, which names its own line.
template <typename... Params>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t dynamic_smem, cudaStream_t stream,
            std::type_identity_t<Params>... args) {
#if defined(ATTOGRAD_CUDA_EMULATION)
  ::emu::launch(kernel, grid, block, dynamic_smem, stream, args...);
#else
  kernel<<<grid, block, dynamic_smem, stream>>>(args...);
#endif
}

// Whether `kernel` may already take `bytes` of dynamic shared memory on the
// current device, and noting that it may (cuda/runtime.cu keeps what was set).
bool shared_memory_allowed(const void* kernel, std::size_t bytes);
void note_shared_memory_allowed(const void* kernel, std::size_t bytes);

// Kernels asking for more than 48 KiB of dynamic shared memory must say so
// first, once per device: the attribute is a driver call, which a launch
// of every step would pay again.
template <typename Kernel>
void allow_shared_memory(Kernel kernel, std::size_t bytes) {
  const void* key = reinterpret_cast<const void*>(kernel);
  if (bytes <= 48 * 1024 || shared_memory_allowed(key, bytes)) return;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  note_shared_memory_allowed(key, bytes);
}

// x, which the compiler may no longer take for the value it computed: what
// is worked out from it stays where it is written, not hoisted to the
// kernel's start (where, for an epilogue's addresses, it would take registers
// the main loop needs, and spill).
__device__ __forceinline__ int opaque(int x) {
#if !defined(ATTOGRAD_CUDA_EMULATION)
  asm volatile("" : "+r"(x));
#endif
  return x;
}

// The block's dynamic shared memory (the launch's dynamic_smem bytes), as T.
template <typename T>
__device__ __forceinline__ T* dynamic_shared_memory() {
#if defined(ATTOGRAD_CUDA_EMULATION)
  return static_cast<T*>(::emu::dynamic_shared_memory());
#else
  extern __shared__ __align__(16) unsigned char dynamic_smem[];  // one type for every T, as nvcc requires
  return reinterpret_cast<T*>(dynamic_smem);
#endif
}

// Index of this thread in a 1-D grid and the grid's total thread count, in 64 bits.
__device__ __forceinline__ std::int64_t global_thread() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_threads() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

// acc + load(begin) + ... + load(end - 1), added in that order in float64. One
// thread summing a column is one dependent chain: loads are issued eight ahead
// of their adds, or each add waits out a whole memory latency. The order, and
// so the result, is the plain loop's. (Still latency-bound where too few
// threads take part.)
template <typename Load>
__device__ __forceinline__ double sum_in_order(std::int64_t begin, std::int64_t end, Load load, double acc = 0) {
  constexpr int kAhead = 8;
  std::int64_t i = begin;
  for (; i + kAhead <= end; i += kAhead) {
    double v[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) v[u] = static_cast<double>(load(i + u));
#pragma unroll
    for (int u = 0; u < kAhead; ++u) acc += v[u];
  }
  for (; i < end; ++i) acc += static_cast<double>(load(i));
  return acc;
}

struct SumOp {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
// NaN-skipping like the CPU's row_max: a NaN never wins a comparison. The NaN
// still poisons the exponentials computed from the row downstream.
struct MaxOp {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return b > a ? b : a; }
};
// A max that any NaN wins, in either order. MaxOp's answer to a NaN depends on
// the order, so after a warp_reduce the lanes of a warp can disagree; where
// code branches on the max (the attention forward), they must not.
struct NanMaxOp {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const {
    return a != a ? a : (b != b ? b : (b > a ? b : a));
  }
};

// Reduces v over the 32 lanes of a warp; every lane gets the result.
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Reduces v over the Threads threads that share one row: a warp (Threads = 32)
// or the whole block (Threads = blockDim.x, a multiple of 32). Every thread of
// the row gets the result. All threads of the block must call it together.
template <int Threads, typename T, typename Op>
__device__ __forceinline__ T row_reduce(T v, Op op) {
  static_assert(Threads % kWarp == 0);
  v = warp_reduce(v, op);
  if constexpr (Threads > kWarp) {
    __shared__ T partial[Threads / kWarp];
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    __syncthreads();  // a previous call's readers are done with `partial`
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = partial[0];
#pragma unroll
    for (int w = 1; w < Threads / kWarp; ++w) v = op(v, partial[w]);
  }
  return v;
}

// ---- column sums -----------------------------------------------------------------------------
// Sums down the columns of a (rows, n) matrix (a bias gradient, LayerNorm's
// parameter gradients) give a block of kThreads threads kWarp neighbouring
// columns and kColumnLanes lanes per column, thread = lane * kWarp + column:
// lane l sums rows l, l + kColumnLanes, ... of the block's chunk of rows, so
// each warp reads 32 neighbouring values of one row at a time, and eight warps
// a block keep loads in flight. One thread per column, walking the column
// alone, left the GPU at two warps an SM on a GPT's narrow tensors.
// The rows are cut into chunks (grid.y) that write float64 partial sums, added
// by a second pass in chunk order: deterministic, no atomics.
constexpr int kColumnLanes = kThreads / kWarp;

// Chunks of rows for a column sum: enough that about 64K threads work, each
// lane summing at least 8 rows of its chunk, and at most 4096 chunks.
inline std::int64_t column_sum_chunks(std::int64_t rows, std::int64_t n) {
  const std::int64_t threads_per_chunk = (n + kWarp - 1) / kWarp * kThreads;
  return std::clamp<std::int64_t>(65536 / threads_per_chunk, 1,
                                  std::clamp<std::int64_t>(rows / (8 * kColumnLanes), 1, 4096));
}

// How many of rows [begin, end) lane `lane` of a column sum takes.
__device__ __forceinline__ std::int64_t lane_rows(std::int64_t begin, std::int64_t end, int lane) {
  return begin + lane < end ? (end - begin - lane + kColumnLanes - 1) / kColumnLanes : 0;
}

// Adds each column's N values over its kColumnLanes lanes, in lane order; the
// threads of lane 0 get the sums. Every thread of the block calls it together.
template <int N>
__device__ __forceinline__ void add_column_lanes(double (&v)[N]) {
  __shared__ double lanes[N][kColumnLanes][kWarp];
  const int column = threadIdx.x % kWarp, lane = threadIdx.x / kWarp;
  __syncthreads();  // a previous call's readers are done with `lanes`
#pragma unroll
  for (int k = 0; k < N; ++k) lanes[k][lane][column] = v[k];
  __syncthreads();
  if (lane != 0) return;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    double sum = lanes[k][0][column];
#pragma unroll
    for (int l = 1; l < kColumnLanes; ++l) sum += lanes[k][l][column];
    v[k] = sum;
  }
}

// ---- row kernels -----------------------------------------------------------------------------
// Row ops (softmax, layer norm, cross-entropy, a reduction's rows) give each
// row of n elements a warp, or for rows longer than kLongRow the whole block.
constexpr std::int64_t kLongRow = 1024;

// The loop of a kernel written for `Threads` threads per row: each group of
// Threads threads takes a row, kThreads / Threads rows a block, the blocks
// striding over the grid until all `rows` are done. body(row, lane, active)
// runs on every thread in every round: a thread whose row is past the end
// (active false) reads and writes nothing but still joins the row's
// reductions, which synchronise the block.
template <int Threads, typename Body>
__device__ __forceinline__ void for_each_row(std::int64_t rows, Body body) {
  constexpr int kRowsPerBlock = kThreads / Threads;
  const int lane = threadIdx.x % Threads;
  for (std::int64_t first = std::int64_t(blockIdx.x) * kRowsPerBlock; first < rows;
       first += std::int64_t(gridDim.x) * kRowsPerBlock) {
    const std::int64_t row = first + threadIdx.x / Threads;
    body(row, lane, row < rows);
  }
}

// Calls launch_with(std::integral_constant<int, Threads>{}, grid) for the right Threads, then checks the launch.
template <typename Launch>
void launch_rows(std::int64_t rows, std::int64_t n, Launch launch_with) {
  auto grid = [rows](int threads_per_row) {
    const std::int64_t rows_per_block = kThreads / threads_per_row;
    return static_cast<unsigned>(std::clamp<std::int64_t>((rows + rows_per_block - 1) / rows_per_block, 1, 32768));
  };
  if (rows == 0) return;
  if (n > kLongRow)
    launch_with(std::integral_constant<int, kThreads>{}, grid(kThreads));
  else
    launch_with(std::integral_constant<int, kWarp>{}, grid(kWarp));
  CUDA_CHECK_LAUNCH();
}

// Math by element type: the float versions are the single-precision functions
// (accurate ones: no -use_fast_math), the double versions the double ones.
namespace dmath {
__device__ __forceinline__ float exp(float x) { return ::expf(x); }
__device__ __forceinline__ double exp(double x) { return ::exp(x); }
__device__ __forceinline__ float log(float x) { return ::logf(x); }
__device__ __forceinline__ double log(double x) { return ::log(x); }
__device__ __forceinline__ float sqrt(float x) { return ::sqrtf(x); }
__device__ __forceinline__ double sqrt(double x) { return ::sqrt(x); }
__device__ __forceinline__ float tanh(float x) { return ::tanhf(x); }
__device__ __forceinline__ double tanh(double x) { return ::tanh(x); }
__device__ __forceinline__ float abs(float x) { return ::fabsf(x); }
__device__ __forceinline__ double abs(double x) { return ::fabs(x); }
__device__ __forceinline__ float pow(float x, float y) { return ::powf(x, y); }
__device__ __forceinline__ double pow(double x, double y) { return ::pow(x, y); }
template <typename T> __device__ __forceinline__ T neg_infinity() { return -static_cast<T>(INFINITY); }
}  // namespace dmath

}  // namespace attograd::cuda
