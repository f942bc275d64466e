// Gradient clipping's two passes on the GPU, each over up to 32 tensors a
// launch, where kernels a tensor (and, for the norm, a wait a tensor) kept the
// host from queueing a training step ahead of the GPU: the sum of squares,
// each block's partial in float64 in a fixed order (its threads' strided
// sums, then row_reduce's fixed tree), then one block adds the partials in a fixed order;
// and the scale, as mul_scalar.
#include <cstdint>

#include "cuda/device_utils.cuh"
#include "cuda/launchers.h"
#include "cuda/tensor_launches.cuh"

namespace attograd::cuda {
namespace {

constexpr unsigned kMaxBlocksPerTensor = 256;  // a partial a block: few enough for one block to add up

__global__ void squares_kernel(TensorLaunch<FloatSpan> spans, double* partials) {
  const BlockOfTensor b(spans);
  const FloatSpan t = spans.tensors[b.k];
  double sum = 0;
  for (std::int64_t i = b.first(); i < t.n; i += b.stride()) {
    const double x = t.data[i];
    sum += x * x;
  }
  sum = row_reduce<kThreads>(sum, SumOp{});
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void add_partials_kernel(const double* partials, std::int64_t count, double* result) {
  double sum = 0;
  for (std::int64_t i = threadIdx.x; i < count; i += kThreads) sum += partials[i];
  sum = row_reduce<kThreads>(sum, SumOp{});
  if (threadIdx.x == 0) *result = sum;
}

__global__ void scale_kernel(TensorLaunch<FloatSpan> spans, float s) {
  const BlockOfTensor b(spans);
  const FloatSpan t = spans.tensors[b.k];
  for (std::int64_t i = b.first(); i < t.n; i += b.stride()) t.data[i] = t.data[i] * s;
}

}  // namespace

std::int64_t sum_of_squares_blocks(const FloatSpan* tensors, int count) {
  std::int64_t blocks = 0;
  for (int k = 0; k < count; ++k) blocks += blocks_for(tensors[k].n, kMaxBlocksPerTensor);
  return blocks;
}

void sum_of_squares(const FloatSpan* tensors, int count, double* partials, double* result, cudaStream_t stream) {
  std::int64_t done = 0;  // partials written by earlier launches
  for_each_tensor_launch(
      tensors, count,
      [&](const TensorLaunch<FloatSpan>& spans, int blocks) {
        launch(squares_kernel, blocks, kThreads, 0, stream, spans, partials + done);
        CUDA_CHECK_LAUNCH();
        done += blocks;
      },
      kMaxBlocksPerTensor);
  launch(add_partials_kernel, 1, kThreads, 0, stream, partials, done, result);
  CUDA_CHECK_LAUNCH();
}

void scale(const FloatSpan* tensors, int count, float s, cudaStream_t stream) {
  for_each_tensor_launch(tensors, count, [&](const TensorLaunch<FloatSpan>& spans, int blocks) {
    launch(scale_kernel, blocks, kThreads, 0, stream, spans, s);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace attograd::cuda
