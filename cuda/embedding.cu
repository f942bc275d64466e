// Embedding: rows of a (V, C) table picked by int64 ids, and the backward that
// sums gradient rows into a (V, C) table.
//
// The backward is deterministic, as every other kernel here is, and equals the
// CPU's to the bit: row v of dweight adds the dy rows of the ids equal to v in
// increasing position, starting from zero, as cpu/embedding.cpp does (only
// additions, so nothing for the compiler to contract). A scatter with atomicAdd
// would add a row hit many times in whatever order the threads arrive, and two
// runs of one seed would drift apart. Two steps on the stream:
//  1. group_by_id, one block: a stable counting sort of the positions by id.
//     start[v] .. start[v + 1] is where id v's positions lie in `order`.
//     (group_small for tables of up to 256 rows: a character vocabulary's.)
//  2. sum_groups, one thread per (v, c): its group's dy values, in that order.
#include <climits>
#include <cstdint>

#include "cuda/buffer.h"
#include "cuda/device_utils.cuh"
#include "cuda/launchers.h"

namespace attograd::cuda {
namespace {

constexpr int kGroupThreads = 1024;  // the one block of group_by_id: 32 warps

template <typename T>
__global__ void embedding_forward_kernel(T* out, const T* weight, const std::int64_t* ids, std::int64_t count,
                                         std::int64_t channels) {
  for (std::int64_t e = global_thread(); e < count * channels; e += grid_threads()) {
    const std::int64_t i = e / channels, c = e % channels;
    out[e] = weight[ids[i] * channels + c];
  }
}

// The inclusive prefix sum of x over the block's kGroupThreads threads; `total`
// gets the sum of all of them. Every thread of the block calls it together.
__device__ int block_inclusive_scan(int x, int* warp_sums, int& total) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
  for (int d = 1; d < kWarp; d *= 2) {
    const int y = __shfl_up_sync(kFullMask, x, d);
    if (lane >= d) x += y;
  }
  if (lane == kWarp - 1) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {  // scan the 32 warps' sums
    int s = warp_sums[lane];
#pragma unroll
    for (int d = 1; d < kWarp; d *= 2) {
      const int y = __shfl_up_sync(kFullMask, s, d);
      if (lane >= d) s += y;
    }
    warp_sums[lane] = s;
  }
  __syncthreads();
  if (warp > 0) x += warp_sums[warp - 1];
  total = warp_sums[kWarp - 1];
  __syncthreads();  // warp_sums is read; the next call may write it
  return x;
}

// One block of kGroupThreads (block_inclusive_scan reads all 32 warps' sums).
// start: rows + 1 entries, cursor: rows, order: count.
__global__ void __launch_bounds__(kGroupThreads)
    group_by_id_kernel(const std::int64_t* ids, int count, int rows, int* start, int* cursor, int* order) {
  __shared__ int warp_sums[kWarp];
  __shared__ std::int64_t chunk_ids[kGroupThreads];
  const int t = threadIdx.x;
  // How many positions hold each id, counted one entry up (start[v + 1] for id v),
  // so that the inclusive scan below leaves start[v] = positions of ids below v.
  for (int v = t; v <= rows; v += kGroupThreads) start[v] = 0;
  __syncthreads();
  for (int i = t; i < count; i += kGroupThreads) atomicAdd(start + ids[i] + 1, 1);  // integers: any order
  __syncthreads();
  int carry = 0;
  for (int base = 0; base <= rows; base += kGroupThreads) {  // the same trip count on every thread
    const int v = base + t;
    int total;
    const int sum = carry + block_inclusive_scan(v <= rows ? start[v] : 0, warp_sums, total);
    if (v <= rows) start[v] = sum;
    if (v < rows) cursor[v] = sum;
    carry += total;
  }
  __syncthreads();
  // Positions, a block-wide chunk at a time and in order: a position's place in
  // its group is the group's cursor plus the earlier positions of its id in the
  // chunk; the chunk's last position of each id then moves that cursor on.
  // Two barriers a chunk are enough: every read of chunk_ids comes before the
  // second, so the next chunk may overwrite it at once, and the next chunk's
  // first orders the cursor moves before its reads of the cursors.
  for (int base = 0; base < count; base += kGroupThreads) {
    const int i = base + t, n = min(kGroupThreads, count - base);
    const std::int64_t id = i < count ? ids[i] : -1;
    chunk_ids[t] = id;
    __syncthreads();
    int earlier = 0;
    bool last = true;
    if (i < count) {
      for (int s = 0; s < t; ++s) earlier += chunk_ids[s] == id;
      for (int s = t + 1; s < n && last; ++s) last = chunk_ids[s] != id;
      order[cursor[id] + earlier] = i;
    }
    __syncthreads();  // every cursor read before any moves
    if (i < count && last) cursor[id] += earlier + 1;
  }
}

constexpr int kSmallRows = 256;  // tables this small take group_small_kernel: 32 KB of counts

// group_by_id_kernel's result (start, order) for tables of at most kSmallRows
// rows, in one pass over the ids where that kernel compares each position with
// every earlier one of its chunk (quadratic in the toy GPT's 4096 ids).
// The positions split into kWarp contiguous segments, a warp each. Each warp
// counts its segment's ids; id v's positions in segment w then go after v's
// positions in the segments before w, and lane 0 of each warp places its
// segment's positions in order. One block of kGroupThreads (>= kSmallRows).
__global__ void __launch_bounds__(kGroupThreads)
    group_small_kernel(const std::int64_t* ids, int count, int rows, int* start, int* order) {
  __shared__ int counts[kWarp][kSmallRows];  // counts[w][v]; then where warp w puts its next position of id v
  __shared__ int warp_sums[kWarp];
  const int t = threadIdx.x, lane = t % kWarp, warp = t / kWarp;
  for (int e = t; e < kWarp * kSmallRows; e += kGroupThreads) counts[e / kSmallRows][e % kSmallRows] = 0;
  __syncthreads();
  const int segment = (count + kWarp - 1) / kWarp, first = min(count, warp * segment),
            last = min(count, first + segment);
  for (int i = first + lane; i < last; i += kWarp) atomicAdd(&counts[warp][ids[i]], 1);  // integers: any order
  __syncthreads();
  // Thread v: id v's positions in the segments before each w, then everything below id v.
  int total = 0;
  if (t < rows)
    for (int w = 0; w < kWarp; ++w) {
      const int c = counts[w][t];
      counts[w][t] = total;
      total += c;
    }
  int all;
  const int below = block_inclusive_scan(total, warp_sums, all) - total;
  if (t < rows) {
    start[t] = below;
    for (int w = 0; w < kWarp; ++w) counts[w][t] += below;
  }
  if (t == 0) start[rows] = all;
  __syncthreads();
  for (int base = first; base < last; base += kWarp) {  // the same trip counts on every lane of the warp
    const int id = base + lane < last ? static_cast<int>(ids[base + lane]) : 0;
    for (int j = 0; j < min(kWarp, last - base); ++j) {
      const int id_j = __shfl_sync(kFullMask, id, j);
      if (lane == 0) order[counts[warp][id_j]++] = base + j;
    }
  }
}

// dweight[v][c] = 0 + dy[i0][c] + dy[i1][c] + ..., over id v's positions in increasing order.
template <typename T>
__global__ void sum_groups_kernel(T* dweight, const T* dy, const int* start, const int* order, std::int64_t rows,
                                  std::int64_t channels) {
  for (std::int64_t e = global_thread(); e < rows * channels; e += grid_threads()) {
    const std::int64_t v = e / channels, c = e % channels;
    T sum = 0;
    for (int k = start[v]; k < start[v + 1]; ++k) sum += dy[order[k] * channels + c];
    dweight[e] = sum;
  }
}

}  // namespace

template <typename T>
void embedding_forward(T* out, const T* weight, const std::int64_t* ids, std::int64_t count, std::int64_t channels,
                       cudaStream_t stream) {
  if (count * channels == 0) return;
  launch(embedding_forward_kernel<T>, grid_for(count * channels), kThreads, 0, stream, out, weight, ids, count,
         channels);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void embedding_backward(T* dweight, const T* dy, const std::int64_t* ids, std::int64_t count, std::int64_t channels,
                        std::int64_t num_rows, cudaStream_t stream) {
  if (num_rows * channels == 0) return;
  if (count == 0) {
    CUDA_CHECK(cudaMemsetAsync(dweight, 0, sizeof(T) * num_rows * channels, stream));
    return;
  }
  // Positions and ids are counted in int, and the kernel's loops step a block's
  // width past the last one: 2^31 - 1024 ids are 16 GiB of them.
  constexpr std::int64_t kMost = INT_MAX - kGroupThreads;
  AG_CHECK(count <= kMost && num_rows <= kMost, "embedding backward",
           "{} ids into {} rows: the CUDA backward counts them in 32 bits (at most {})", count, num_rows, kMost);
  DeviceBuffer groups(sizeof(int) * static_cast<std::size_t>(2 * num_rows + 1 + count));
  int* start = groups.as<int>();
  int* cursor = start + num_rows + 1;
  int* order = cursor + num_rows;
  if (num_rows <= kSmallRows)
    launch(group_small_kernel, 1, kGroupThreads, 0, stream, ids, static_cast<int>(count), static_cast<int>(num_rows),
           start, order);
  else
    launch(group_by_id_kernel, 1, kGroupThreads, 0, stream, ids, static_cast<int>(count), static_cast<int>(num_rows),
           start, cursor, order);
  CUDA_CHECK_LAUNCH();
  launch(sum_groups_kernel<T>, grid_for(num_rows * channels), kThreads, 0, stream, dweight, dy, start, order, num_rows,
         channels);
  CUDA_CHECK_LAUNCH();
}

#define AG_INSTANTIATE(T)                                                                                        \
  template void embedding_forward<T>(T*, const T*, const std::int64_t*, std::int64_t, std::int64_t, cudaStream_t); \
  template void embedding_backward<T>(T*, const T*, const std::int64_t*, std::int64_t, std::int64_t, std::int64_t, \
                                      cudaStream_t);
AG_INSTANTIATE(float)
AG_INSTANTIATE(double)
#undef AG_INSTANTIATE

}  // namespace attograd::cuda
