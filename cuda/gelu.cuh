#pragma once
// GELU and its derivative on the device, shared by the element-wise kernels
// (cuda/elementwise.cu) and the products that apply them as C leaves
// (cuda/matmul_bf16_pipelined.cu's epilogues): one definition, so that a fused
// path gives the element-wise kernel's bits.
#include "base/elementwise_ops.h"
#include "cuda/device_utils.cuh"

namespace attograd::cuda {

// GELU's tanh form as x sigmoid(2u), u = k (x + c x^3), as on the CPU
// (cpu/elementwise.cpp): 0.5 (1 + tanh(u)) = sigmoid(2u), without the
// cancellation of 1 + tanh(u) for very negative x.
template <typename T>
__device__ __forceinline__ T gelu_sigmoid(T x) {
  const T k = kGeluScale<T>, c = kGeluCubic<T>;
  return T(1) / (T(1) + dmath::exp(T(-2) * k * (x + c * x * x * x)));
}
template <typename T>
__device__ __forceinline__ T gelu(T x) {
  return x * gelu_sigmoid(x);
}
template <typename T>
__device__ __forceinline__ T gelu_grad(T x) {
  // forward: y = x s, s = sigmoid(2u); so dy/dx = s + 2 x s (1 - s) k (1 + 3 c x^2)
  const T k = kGeluScale<T>, c = kGeluCubic<T>;
  const T s = gelu_sigmoid(x);
  return s + T(2) * x * s * (T(1) - s) * k * (T(1) + T(3) * c * x * x);
}

}  // namespace attograd::cuda
