// AdamW as one fused kernel: each element of a parameter is read and written
// once per step (param, grad, m, v), instead of once per elementwise op of the
// update, and one launch updates up to 32 parameters. The arithmetic is
// cpu/adamw.cpp's, in the same order, with the step's scalars folded
// on the host in float64 (cuda::AdamWScalars).
#include <algorithm>
#include <cstdint>

#include "cuda/device_utils.cuh"
#include "cuda/launchers.h"

namespace attograd::cuda {
namespace {

// A launch's tensors travel in the kernel's parameters (1.7 KB of the 4 KB
// allowed): tensor k takes blocks [first_block[k], first_block[k + 1]).
constexpr int kTensorsPerLaunch = 32;
struct AdamWLaunch {
  AdamWTensor tensors[kTensorsPerLaunch];
  int first_block[kTensorsPerLaunch + 1];
};

__global__ void adamw_kernel(AdamWLaunch launch_tensors, AdamWScalars s) {
  const int block = static_cast<int>(blockIdx.x);
  int k = 0;
  while (block >= launch_tensors.first_block[k + 1]) ++k;  // tensors with no blocks are passed over
  const AdamWTensor t = launch_tensors.tensors[k];
  const std::int64_t stride =
      std::int64_t(launch_tensors.first_block[k + 1] - launch_tensors.first_block[k]) * kThreads;
  for (std::int64_t i = std::int64_t(block - launch_tensors.first_block[k]) * kThreads + threadIdx.x; i < t.n;
       i += stride) {
    const float g = t.grad[i];
    const float mi = s.beta1 * t.m[i] + s.one_minus_beta1 * g;
    const float vi = s.beta2 * t.v[i] + s.one_minus_beta2 * g * g;
    t.m[i] = mi;
    t.v[i] = vi;
    t.param[i] = t.param[i] * t.decay - s.step_size * mi / (sqrtf(vi) * s.inv_sqrt_bc2 + s.eps);
  }
}

}  // namespace

void adamw_step(const AdamWTensor* tensors, int count, const AdamWScalars& s, cudaStream_t stream) {
  for (int first = 0; first < count; first += kTensorsPerLaunch) {
    const int here = std::min(kTensorsPerLaunch, count - first);
    AdamWLaunch launch_tensors{};
    int blocks = 0;
    for (int k = 0; k < here; ++k) {
      launch_tensors.tensors[k] = tensors[first + k];
      launch_tensors.first_block[k] = blocks;
      blocks += tensors[first + k].n > 0 ? static_cast<int>(grid_for(tensors[first + k].n)) : 0;
    }
    launch_tensors.first_block[here] = blocks;
    if (blocks == 0) continue;
    launch(adamw_kernel, blocks, kThreads, 0, stream, launch_tensors, s);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace attograd::cuda
