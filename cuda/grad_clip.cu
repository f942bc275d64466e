// Gradient clipping's two passes on the GPU, each over up to 32 tensors a
// launch, where kernels a tensor (and, for the norm, a wait a tensor) kept the
// host from queueing a training step ahead of the GPU: the sum of squares,
// each block's partial in float64 in a fixed order (its threads' strided
// sums, then a fixed tree), then one block adds the partials in a fixed order;
// and the scale, as mul_scalar.
#include <algorithm>
#include <cstdint>

#include "cuda/device_utils.cuh"
#include "cuda/launchers.h"

namespace attograd::cuda {
namespace {

constexpr int kSpansPerLaunch = 32;
constexpr int kMaxBlocksPerTensor = 256;  // a partial a block: few enough for one block to add up
struct SpanLaunch {
  FloatSpan tensors[kSpansPerLaunch];
  int first_block[kSpansPerLaunch + 1];
};

int blocks_of(std::int64_t n) { return n > 0 ? static_cast<int>(std::min<unsigned>(grid_for(n), kMaxBlocksPerTensor)) : 0; }

// The launches of `count` tensors, up to 32 each: make(launch, blocks, first) for each.
template <typename Make>
void for_each_launch(const FloatSpan* tensors, int count, bool capped, Make make) {
  for (int first = 0; first < count; first += kSpansPerLaunch) {
    const int here = std::min(kSpansPerLaunch, count - first);
    SpanLaunch spans{};
    int blocks = 0;
    for (int k = 0; k < here; ++k) {
      spans.tensors[k] = tensors[first + k];
      spans.first_block[k] = blocks;
      const std::int64_t n = tensors[first + k].n;
      blocks += capped ? blocks_of(n) : (n > 0 ? static_cast<int>(grid_for(n)) : 0);
    }
    spans.first_block[here] = blocks;
    make(spans, blocks);
  }
}

// The tensor of this block, and the block's index among that tensor's.
struct BlockOf {
  int k, index, count;
  __device__ __forceinline__ explicit BlockOf(const SpanLaunch& s) {
    const int block = static_cast<int>(blockIdx.x);
    k = 0;
    while (block >= s.first_block[k + 1]) ++k;  // tensors with no blocks are passed over
    index = block - s.first_block[k];
    count = s.first_block[k + 1] - s.first_block[k];
  }
};

// The block's threads' values summed in a fixed order: each warp by a
// butterfly, then the warps' sums one after the other by thread 0.
__device__ __forceinline__ double block_sum(double v) {
  __shared__ double warp_sums[kThreads / kWarp];
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  if (threadIdx.x % kWarp == 0) warp_sums[warp] = v;
  __syncthreads();
  double sum = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kThreads / kWarp; ++w) sum += warp_sums[w];
  return sum;  // thread 0's
}

__global__ void squares_kernel(SpanLaunch spans, double* partials) {
  const BlockOf b(spans);
  const FloatSpan t = spans.tensors[b.k];
  double sum = 0;
  for (std::int64_t i = std::int64_t(b.index) * kThreads + threadIdx.x; i < t.n; i += std::int64_t(b.count) * kThreads) {
    const double x = t.data[i];
    sum += x * x;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void add_partials_kernel(const double* partials, std::int64_t count, double* result) {
  double sum = 0;
  for (std::int64_t i = threadIdx.x; i < count; i += kThreads) sum += partials[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) *result = sum;
}

__global__ void scale_kernel(SpanLaunch spans, float s) {
  const BlockOf b(spans);
  const FloatSpan t = spans.tensors[b.k];
  for (std::int64_t i = std::int64_t(b.index) * kThreads + threadIdx.x; i < t.n; i += std::int64_t(b.count) * kThreads)
    t.data[i] = t.data[i] * s;
}

}  // namespace

std::int64_t sum_of_squares_blocks(const FloatSpan* tensors, int count) {
  std::int64_t blocks = 0;
  for (int k = 0; k < count; ++k) blocks += blocks_of(tensors[k].n);
  return blocks;
}

void sum_of_squares(const FloatSpan* tensors, int count, double* partials, double* result, cudaStream_t stream) {
  std::int64_t done = 0;  // partials written by earlier launches
  for_each_launch(tensors, count, true, [&](const SpanLaunch& spans, int blocks) {
    if (blocks == 0) return;
    launch(squares_kernel, blocks, kThreads, 0, stream, spans, partials + done);
    CUDA_CHECK_LAUNCH();
    done += blocks;
  });
  launch(add_partials_kernel, 1, kThreads, 0, stream, partials, done, result);
  CUDA_CHECK_LAUNCH();
}

void scale(const FloatSpan* tensors, int count, float s, cudaStream_t stream) {
  for_each_launch(tensors, count, false, [&](const SpanLaunch& spans, int blocks) {
    if (blocks == 0) return;
    launch(scale_kernel, blocks, kThreads, 0, stream, spans, s);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace attograd::cuda
