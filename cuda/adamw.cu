// AdamW as one fused kernel: each element of a parameter is read and written
// once per step (param, grad, m, v), instead of once per elementwise op of the
// update. The arithmetic is tensor/cpu/optimizer.cpp's, in the same order, with
// the step's scalars folded on the host in float64 (cuda::AdamWScalars).
#include <cstdint>

#include "cuda/device_utils.cuh"
#include "cuda/launchers.h"

namespace attograd::cuda {
namespace {

__global__ void adamw_kernel(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ m,
                             float* __restrict__ v, std::int64_t n, AdamWScalars s) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float g = grad[i];
    const float mi = s.beta1 * m[i] + s.one_minus_beta1 * g;
    const float vi = s.beta2 * v[i] + s.one_minus_beta2 * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * s.decay - s.step_size * mi / (sqrtf(vi) * s.inv_sqrt_bc2 + s.eps);
  }
}

}  // namespace

void adamw_step(float* param, const float* grad, float* m, float* v, std::int64_t n, const AdamWScalars& s,
                cudaStream_t stream) {
  if (n == 0) return;
  launch(adamw_kernel, grid_for(n), kThreads, 0, stream, param, grad, m, v, n, s);
  CUDA_CHECK_LAUNCH();
}

}  // namespace attograd::cuda
