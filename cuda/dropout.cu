// Dropout masks from the counter-based Philox stream of base/philox.h: element
// i is dropped when philox_uniform(seed, offset, i) < p, the very function the
// CPU evaluates (cpu/dropout.cpp), so a seed and an offset give the same
// mask on both devices, bit for bit. One Philox call yields four lanes, so
// each thread fills four consecutive elements.
#include <cstdint>

#include "base/philox.h"
#include "cuda/device_utils.cuh"
#include "cuda/launchers.h"

namespace attograd::cuda {
namespace {

template <typename T>
__global__ void dropout_mask_kernel(T* mask, std::int64_t n, float threshold, T keep, std::uint64_t seed,
                                    std::uint64_t offset) {
  const std::int64_t groups = (n + 3) / 4;
  for (std::int64_t k = global_thread(); k < groups; k += grid_threads()) {
    const Philox4 bits = philox4x32(offset + static_cast<std::uint64_t>(k), seed);
#pragma unroll
    for (int lane = 0; lane < 4; ++lane)
      if (4 * k + lane < n) mask[4 * k + lane] = uniform_from_bits(bits.v[lane]) < threshold ? T(0) : keep;
  }
}

}  // namespace

template <typename T>
void dropout_mask(T* mask, std::int64_t n, float threshold, T keep, std::uint64_t seed, std::uint64_t offset,
                  cudaStream_t stream) {
  if (n == 0) return;
  launch(dropout_mask_kernel<T>, grid_for((n + 3) / 4), kThreads, 0, stream, mask, n, threshold, keep, seed, offset);
  CUDA_CHECK_LAUNCH();
}

template void dropout_mask<float>(float*, std::int64_t, float, float, std::uint64_t, std::uint64_t, cudaStream_t);
template void dropout_mask<double>(double*, std::int64_t, float, double, std::uint64_t, std::uint64_t, cudaStream_t);
template void dropout_mask<bfloat16>(bfloat16*, std::int64_t, float, bfloat16, std::uint64_t, std::uint64_t,
                                     cudaStream_t);

}  // namespace attograd::cuda
