// AdamW as one fused kernel: each element of a parameter is read and written
// once per step (param, grad, m, v), instead of once per elementwise op of the
// update, and one launch updates up to 32 parameters. The arithmetic is
// cpu/adamw.cpp's, in the same order, with the step's scalars folded
// on the host in float64 (cuda::AdamWScalars).
#include <cstdint>

#include "cuda/device_utils.cuh"
#include "cuda/launchers.h"
#include "cuda/tensor_launches.cuh"

namespace attograd::cuda {
namespace {

// A launch's tensors travel in the kernel's parameters (1.7 KB of the 4 KB allowed).
__global__ void adamw_kernel(TensorLaunch<AdamWTensor> launch_tensors, AdamWScalars s) {
  const BlockOfTensor b(launch_tensors);
  const AdamWTensor t = launch_tensors.tensors[b.k];
  for (std::int64_t i = b.first(); i < t.n; i += b.stride()) {
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
  for_each_tensor_launch(tensors, count, [&](const TensorLaunch<AdamWTensor>& launch_tensors, int blocks) {
    launch(adamw_kernel, blocks, kThreads, 0, stream, launch_tensors, s);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace attograd::cuda
