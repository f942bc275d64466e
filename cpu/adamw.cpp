// Fused optimizer updates: one pass over contiguous buffers instead of a chain
// of elementwise kernels each reading and writing the whole parameter.
#include <cmath>
#include <vector>

#include "cpu/vec_math.h"
#include "tensor/device_kernels.h"
#include "cpu/parallel.h"

namespace attograd::cpu {
namespace {

// The step's scalars, folded once in float64 as torch does.
template <typename T>
struct AdamWScalars {
  T decay, b1, b2, one_minus_b1, one_minus_b2, step_size, inv_sqrt_bc2, eps;
};

template <typename T>
AdamWScalars<T> fold(const kernels::AdamWStep& s) {
  const double bias_correction1 = 1.0 - std::pow(s.beta1, static_cast<double>(s.step));
  const double bias_correction2 = 1.0 - std::pow(s.beta2, static_cast<double>(s.step));
  return {.decay = static_cast<T>(1.0 - s.lr * s.weight_decay),
          .b1 = static_cast<T>(s.beta1),
          .b2 = static_cast<T>(s.beta2),
          .one_minus_b1 = static_cast<T>(1.0 - s.beta1),
          .one_minus_b2 = static_cast<T>(1.0 - s.beta2),
          .step_size = static_cast<T>(s.lr / bias_correction1),
          .inv_sqrt_bc2 = static_cast<T>(1.0 / std::sqrt(bias_correction2)),
          .eps = static_cast<T>(s.eps)};
}

template <typename T>
AG_ALWAYS_INLINE void adamw_range(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v,
                                  std::int64_t n, const AdamWScalars<T>& s) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T gi = g[i];
    const T mi = s.b1 * m[i] + s.one_minus_b1 * gi;
    const T vi = s.b2 * v[i] + s.one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * s.decay - s.step_size * mi / (std::sqrt(vi) * s.inv_sqrt_bc2 + s.eps);
  }
}

// float32 on the widest vectors: the square root and the division (vectorised
// since -fno-math-errno) bound this loop more than memory does. As in the other
// clones, GCC contracts products and sums into FMAs on the levels that have them.
AG_SIMD_CLONES void adamw_chunk(float* p, const float* g, float* m, float* v, std::int64_t n,
                                const AdamWScalars<float>& s) {
  adamw_range(p, g, m, v, n, s);
}
void adamw_chunk(double* p, const double* g, double* m, double* v, std::int64_t n, const AdamWScalars<double>& s) {
  adamw_range(p, g, m, v, n, s);
}

void adamw_one(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const kernels::AdamWStep& s) {
  AG_DISPATCH_FLOAT(param.dtype(), "adamw", [&] {
    using T = scalar_t;
    const AdamWScalars<T> folded = fold<T>(s);
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* mm = m.data<T>();
    T* vv = v.data<T>();
    parallel_for(0, param.numel(), kParallelGrain, [&](std::int64_t begin, std::int64_t end) {
      adamw_chunk(p + begin, g + begin, mm + begin, vv + begin, end - begin, folded);
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
