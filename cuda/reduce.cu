// Reductions: sum over any set of dims, and max (with the index of the
// first maximum) over one dim.
//
// Two shapes of kernel, picked by which way memory runs:
//  - rows: the reduced dims include the input's fastest one, so the threads of
//    a warp (or a whole block, for long rows) walk one output's elements side
//    by side and combine with warp shuffles;
//  - columns: the kept dims run fastest (a bias gradient summing (B*T, C) to
//    (C)), so neighbouring threads own neighbouring outputs and read
//    neighbouring addresses, eight lanes an output (device_utils.cuh).
// When there are too few outputs to fill the GPU, the reduced elements are cut
// into chunks (grid.y), each chunk writes a partial sum, and a second pass adds
// the partials in a fixed order: deterministic, no atomics. Sums accumulate in
// float64, as the CPU's do; a bfloat16 input is read as it is (widened as
// read, no float32 copy) and its sum rounded once.
#include <cstdint>

#include "cuda/buffer.h"
#include "cuda/device_utils.cuh"
#include "cuda/launchers.h"

namespace attograd::cuda {
namespace {

constexpr std::int64_t kTargetThreads = 65536;  // enough threads in flight to fill a large GPU

__device__ __forceinline__ std::int64_t offset_in(const StridedLayout<1>& layout, std::int64_t i) {
  std::int64_t offset[1];
  offsets_at(layout, i, offset);
  return offset[0];
}

// ---- sum ---------------------------------------------------------------------------------------

// Block (x, y) sums reduced elements [y * chunk, (y + 1) * chunk) of its rows;
// `Threads` threads per row. out is (outputs, gridDim.y).
template <int Threads, typename In, typename Out>
__global__ void sum_rows_kernel(Out* out, const In* x, StridedLayout<1> kept, StridedLayout<1> reduced,
                                std::int64_t chunk) {
  const std::int64_t r_begin = blockIdx.y * chunk, r_end = min(reduced.numel, r_begin + chunk);
  for_each_row<Threads>(kept.numel, [&](std::int64_t o, int lane, bool active) {
    double acc = 0;
    if (active) {
      const In* row = x + offset_in(kept, o);
      for (std::int64_t r = r_begin + lane; r < r_end; r += Threads)
        acc += static_cast<double>(row[offset_in(reduced, r)]);
    }
    acc = row_reduce<Threads>(acc, SumOp{});
    if (active && lane == 0) out[o * gridDim.y + blockIdx.y] = static_cast<Out>(acc);
  });
}

// Block (x, y) sums outputs [x * kWarp, (x + 1) * kWarp) over reduced elements
// [y * chunk, (y + 1) * chunk), its kColumnLanes lanes taking every
// kColumnLanes-th element (device_utils.cuh, column sums). out is (gridDim.y, outputs).
template <typename In, typename Out>
__global__ void sum_columns_kernel(Out* out, const In* x, StridedLayout<1> kept, StridedLayout<1> reduced,
                                   std::int64_t chunk) {
  const int lane = threadIdx.x / kWarp;
  const std::int64_t o = std::int64_t(blockIdx.x) * kWarp + threadIdx.x % kWarp;
  const std::int64_t begin = blockIdx.y * chunk, end = min(reduced.numel, begin + chunk);
  double acc[1] = {0};
  if (o < kept.numel) {
    const In* column = x + offset_in(kept, o);
    acc[0] = sum_in_order(0, lane_rows(begin, end, lane),
                          [&](std::int64_t k) { return column[offset_in(reduced, begin + lane + k * kColumnLanes)]; });
  }
  add_column_lanes(acc);
  if (lane == 0 && o < kept.numel) out[blockIdx.y * kept.numel + o] = static_cast<Out>(acc[0]);
}

StridedLayout<1> dense(std::int64_t size, std::int64_t stride) {
  StridedLayout<1> layout;
  layout.ndim = 1;
  layout.numel = layout.sizes[0] = size;
  layout.strides[0][0] = stride;
  layout.contiguous = stride == 1;
  return layout;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The fastest-moving dim of a layout steps by one element.
bool innermost_is_unit(const StridedLayout<1>& layout) {
  return layout.contiguous || (layout.ndim > 0 && layout.strides[0][layout.ndim - 1] == 1);
}

template <typename In, typename Out>
void sum_rows(Out* out, const In* x, const ReduceLayout& layout, cudaStream_t stream) {
  const std::int64_t outputs = layout.kept.numel, R = layout.reduced.numel;
  const bool long_rows = R >= 2048;
  const int threads_per_row = long_rows ? kThreads : kWarp;
  // Few outputs: split each row into chunks so that about kTargetThreads threads work.
  const std::int64_t chunks =
      std::clamp<std::int64_t>(kTargetThreads / (outputs * threads_per_row), 1, std::max<std::int64_t>(1, R / 2048));
  const std::int64_t chunk = ceil_div(R, chunks);
  const std::int64_t rows_per_block = kThreads / threads_per_row;
  const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>(ceil_div(outputs, rows_per_block), 32768)),
                  static_cast<unsigned>(chunks));
  if (chunks == 1) {
    if (long_rows)
      launch(sum_rows_kernel<kThreads, In, Out>, grid, kThreads, 0, stream, out, x, layout.kept, layout.reduced, chunk);
    else
      launch(sum_rows_kernel<kWarp, In, Out>, grid, kThreads, 0, stream, out, x, layout.kept, layout.reduced, chunk);
    CUDA_CHECK_LAUNCH();
    return;
  }
  DeviceBuffer partial(sizeof(double) * outputs * chunks);  // (outputs, chunks)
  launch(sum_rows_kernel<kThreads, In, double>, grid, kThreads, 0, stream, partial.as<double>(), x, layout.kept,
         layout.reduced, chunk);
  CUDA_CHECK_LAUNCH();
  sum_rows(out, partial.as<const double>(), ReduceLayout{dense(outputs, chunks), dense(chunks, 1)}, stream);
}

template <typename In, typename Out>
void sum_columns(Out* out, const In* x, const ReduceLayout& layout, cudaStream_t stream) {
  const std::int64_t outputs = layout.kept.numel, R = layout.reduced.numel;
  const std::int64_t chunks = column_sum_chunks(R, outputs), chunk = ceil_div(R, chunks);
  const dim3 grid(static_cast<unsigned>(ceil_div(outputs, kWarp)), static_cast<unsigned>(chunks));
  if (chunks == 1) {
    launch(sum_columns_kernel<In, Out>, grid, kThreads, 0, stream, out, x, layout.kept, layout.reduced, chunk);
    CUDA_CHECK_LAUNCH();
    return;
  }
  DeviceBuffer partial(sizeof(double) * chunks * outputs);  // (chunks, outputs)
  launch(sum_columns_kernel<In, double>, grid, kThreads, 0, stream, partial.as<double>(), x, layout.kept,
         layout.reduced, chunk);
  CUDA_CHECK_LAUNCH();
  sum_column_partials(out, partial.as<const double>(), chunks, outputs, stream);
}

// ---- max with index -------------------------------------------------------------------------------

// Whether (v2, i2) replaces the running best (v1, i1); index -1 means "none yet".
// A NaN beats any number, then the larger value, then the smaller index: the
// CPU's sequential scan (cpu/reduce.cpp) picks the same element.
template <typename T>
__device__ __forceinline__ bool replaces(T v1, std::int64_t i1, T v2, std::int64_t i2) {
  if (i2 < 0) return false;
  if (i1 < 0) return true;
  const bool nan1 = v1 != v1, nan2 = v2 != v2;
  if (nan1 || nan2) return nan2 && (!nan1 || i2 < i1);
  if (v2 != v1) return v2 > v1;
  return i2 < i1;
}

template <int Threads, typename T>
__device__ __forceinline__ void argmax_reduce(T& v, std::int64_t& i) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const T v2 = __shfl_xor_sync(kFullMask, v, offset);
    const std::int64_t i2 = __shfl_xor_sync(kFullMask, i, offset);
    if (replaces(v, i, v2, i2)) v = v2, i = i2;
  }
  if constexpr (Threads > kWarp) {
    __shared__ T values[Threads / kWarp];
    __shared__ std::int64_t indices[Threads / kWarp];
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    __syncthreads();
    if (lane == 0) values[warp] = v, indices[warp] = i;
    __syncthreads();
    v = values[0], i = indices[0];
    for (int w = 1; w < Threads / kWarp; ++w)
      if (replaces(v, i, values[w], indices[w])) v = values[w], i = indices[w];
  }
}

template <int Threads, typename T>
__global__ void max_rows_kernel(T* values, std::int64_t* indices, const T* x, StridedLayout<1> kept,
                                StridedLayout<1> reduced) {
  for_each_row<Threads>(kept.numel, [&](std::int64_t o, int lane, bool active) {
    T best = 0;
    std::int64_t best_index = -1;
    if (active) {
      const T* row = x + offset_in(kept, o);
      for (std::int64_t r = lane; r < reduced.numel; r += Threads) {
        const T v = row[offset_in(reduced, r)];
        if (replaces(best, best_index, v, r)) best = v, best_index = r;
      }
    }
    argmax_reduce<Threads>(best, best_index);
    if (active && lane == 0) values[o] = best, indices[o] = best_index;
  });
}

template <typename T>
__global__ void max_columns_kernel(T* values, std::int64_t* indices, const T* x, StridedLayout<1> kept,
                                   StridedLayout<1> reduced) {
  for (std::int64_t o = global_thread(); o < kept.numel; o += grid_threads()) {
    const T* column = x + offset_in(kept, o);
    T best = 0;
    std::int64_t best_index = -1;
    for (std::int64_t r = 0; r < reduced.numel; ++r) {
      const T v = column[offset_in(reduced, r)];
      if (replaces(best, best_index, v, r)) best = v, best_index = r;
    }
    values[o] = best, indices[o] = best_index;
  }
}

}  // namespace

template <typename T>
void sum(T* out, const T* x, const ReduceLayout& layout, cudaStream_t stream) {
  const std::int64_t outputs = layout.kept.numel;
  if (outputs == 0) return;
  if (layout.reduced.numel == 0) {  // an empty sum is zero
    fill(out, T(0), dense(outputs, 1), stream);
    return;
  }
  if (innermost_is_unit(layout.reduced) || !innermost_is_unit(layout.kept))
    sum_rows(out, x, layout, stream);
  else
    sum_columns(out, x, layout, stream);
}

template <typename T>
void max(T* values, std::int64_t* indices, const T* x, const ReduceLayout& layout, cudaStream_t stream) {
  const std::int64_t outputs = layout.kept.numel, R = layout.reduced.numel;
  if (outputs == 0) return;
  if (innermost_is_unit(layout.reduced) || !innermost_is_unit(layout.kept)) {
    const bool long_rows = R >= 2048;
    const std::int64_t rows_per_block = long_rows ? 1 : kThreads / kWarp;
    const unsigned grid = static_cast<unsigned>(std::min<std::int64_t>(ceil_div(outputs, rows_per_block), 32768));
    if (long_rows)
      launch(max_rows_kernel<kThreads, T>, grid, kThreads, 0, stream, values, indices, x, layout.kept, layout.reduced);
    else
      launch(max_rows_kernel<kWarp, T>, grid, kThreads, 0, stream, values, indices, x, layout.kept, layout.reduced);
  } else {
    launch(max_columns_kernel<T>, grid_for(outputs), kThreads, 0, stream, values, indices, x, layout.kept,
           layout.reduced);
  }
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void sum_column_partials(T* out, const double* partial, std::int64_t chunks, std::int64_t n, cudaStream_t stream) {
  sum_columns(out, partial, ReduceLayout{dense(n, 1), dense(chunks, n)}, stream);
}

template void sum<float>(float*, const float*, const ReduceLayout&, cudaStream_t);
template void sum<double>(double*, const double*, const ReduceLayout&, cudaStream_t);
template void sum<bfloat16>(bfloat16*, const bfloat16*, const ReduceLayout&, cudaStream_t);
template void max<float>(float*, std::int64_t*, const float*, const ReduceLayout&, cudaStream_t);
template void max<double>(double*, std::int64_t*, const double*, const ReduceLayout&, cudaStream_t);
template void sum_column_partials<float>(float*, const double*, std::int64_t, std::int64_t, cudaStream_t);
template void sum_column_partials<double>(double*, const double*, std::int64_t, std::int64_t, cudaStream_t);

}  // namespace attograd::cuda
