// Fused optimizer updates: one pass over contiguous buffers instead of a chain
// of elementwise kernels each reading and writing the whole parameter.
#include <cmath>
#include <vector>

#include "tensor/device_kernels.h"
#include "tensor/parallel.h"

namespace attograd::cpu {
namespace {

void adamw_one(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const kernels::AdamWStep& s) {
  const std::int64_t n = param.numel();
  AG_DISPATCH_FLOAT(param.dtype(), "adamw", [&] {
    using T = scalar_t;
    // The scalars are folded once, in float64, as torch does.
    const double bias_correction1 = 1.0 - std::pow(s.beta1, static_cast<double>(s.step));
    const double bias_correction2 = 1.0 - std::pow(s.beta2, static_cast<double>(s.step));
    const T decay = static_cast<T>(1.0 - s.lr * s.weight_decay);
    const T b1 = static_cast<T>(s.beta1), b2 = static_cast<T>(s.beta2);
    const T one_minus_b1 = static_cast<T>(1.0 - s.beta1), one_minus_b2 = static_cast<T>(1.0 - s.beta2);
    const T step_size = static_cast<T>(s.lr / bias_correction1);
    const T inv_sqrt_bc2 = static_cast<T>(1.0 / std::sqrt(bias_correction2));
    const T eps = static_cast<T>(s.eps);
    T* __restrict p = param.data<T>();
    const T* __restrict g = grad.data<T>();
    T* __restrict mm = m.data<T>();
    T* __restrict vv = v.data<T>();
    parallel_for(0, n, kParallelGrain, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        const T gi = g[i];
        const T mi = b1 * mm[i] + one_minus_b1 * gi;
        const T vi = b2 * vv[i] + one_minus_b2 * gi * gi;
        mm[i] = mi;
        vv[i] = vi;
        p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
      }
    });
  });
}

}  // namespace

void adamw_step_(const std::vector<kernels::AdamWParameter>& params, const kernels::AdamWStep& step) {
  for (const kernels::AdamWParameter& p : params) {
    kernels::AdamWStep own = step;
    if (!p.decay) own.weight_decay = 0;
    adamw_one(p.param, p.grad, p.m, p.v, own);
  }
}

}  // namespace attograd::cpu
