// Softmax and log_softmax on the CPU, over the last dim. Inputs arrive
// contiguous (tensor/dispatch_rows.cpp) and are read as (rows, n); rows are
// independent, so they are split across threads when the work is large
// enough (for_each_row, rows.h). Sums within a row go through lane_sum;
// float32 exponentials use the vectorised exp of cpu/vec_math.h.
#include <cmath>

#include "cpu/rows.h"
#include "cpu/vec_math.h"
#include "tensor/device_kernels.h"
#include "tensor/kernel_common.h"
#include "cpu/parallel.h"

namespace attograd::cpu {

// Declared in rows.h, which cross_entropy.cpp shares.
AG_SIMD_CLONES void scaled_exp_f32(float* y, const float* x, float shift, float scale, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = exp_fast(x[i] - shift) * scale;
}

Tensor softmax_forward(const Tensor& x) {
  Tensor y = empty(x.sizes(), x.options());
  const RowShape shape = row_shape(x);
  const std::int64_t rows = shape.rows, n = shape.n;
  AG_DISPATCH_FLOAT(x.dtype(), "softmax", [&] {
    const scalar_t* xs = x.data<scalar_t>();
    scalar_t* ys = y.data<scalar_t>();
    for_each_row(rows, n, [&](std::int64_t r) {
      const scalar_t* xr = xs + r * n;
      scalar_t* yr = ys + r * n;
      // An all -inf row (every position masked) gives -inf - -inf = NaN, as in PyTorch.
      const scalar_t m = row_max(xr, n);
      scaled_exp(yr, xr, m, scalar_t(1), n);
      const auto inv = static_cast<scalar_t>(1.0 / lane_sum(n, [&](std::int64_t i) { return double(yr[i]); }));
      for (std::int64_t i = 0; i < n; ++i) yr[i] *= inv;
    });
  });
  return y;
}

Tensor softmax_backward(const Tensor& y, const Tensor& dy) {
  // forward: y = softmax(x); so dx = y * (dy - sum(dy * y))
  Tensor dx = empty(y.sizes(), y.options());
  const RowShape shape = row_shape(y);
  const std::int64_t rows = shape.rows, n = shape.n;
  AG_DISPATCH_FLOAT(y.dtype(), "softmax backward", [&] {
    const scalar_t *ys = y.data<scalar_t>(), *dys = dy.data<scalar_t>();
    scalar_t* dxs = dx.data<scalar_t>();
    for_each_row(rows, n, [&](std::int64_t r) {
      const scalar_t *yr = ys + r * n, *dyr = dys + r * n;
      scalar_t* dxr = dxs + r * n;
      const auto dot = static_cast<scalar_t>(lane_sum(n, [&](std::int64_t i) { return double(dyr[i]) * yr[i]; }));
      for (std::int64_t i = 0; i < n; ++i) dxr[i] = yr[i] * (dyr[i] - dot);
    });
  });
  return dx;
}

Tensor log_softmax_forward(const Tensor& x) {
  Tensor y = empty(x.sizes(), x.options());
  const RowShape shape = row_shape(x);
  const std::int64_t rows = shape.rows, n = shape.n;
  AG_DISPATCH_FLOAT(x.dtype(), "log_softmax", [&] {
    const scalar_t* xs = x.data<scalar_t>();
    scalar_t* ys = y.data<scalar_t>();
    for_each_row(rows, n, [&](std::int64_t r) {
      const scalar_t* xr = xs + r * n;
      scalar_t* yr = ys + r * n;
      const auto lse = static_cast<scalar_t>(row_logsumexp(xr, /*scratch=*/yr, n));
      for (std::int64_t i = 0; i < n; ++i) yr[i] = xr[i] - lse;
    });
  });
  return y;
}

Tensor log_softmax_backward(const Tensor& y, const Tensor& dy) {
  // forward: y = x - log(sum(exp(x))); so dx = dy - exp(y) * sum(dy)
  Tensor dx = empty(y.sizes(), y.options());
  const RowShape shape = row_shape(y);
  const std::int64_t rows = shape.rows, n = shape.n;
  AG_DISPATCH_FLOAT(y.dtype(), "log_softmax backward", [&] {
    const scalar_t *ys = y.data<scalar_t>(), *dys = dy.data<scalar_t>();
    scalar_t* dxs = dx.data<scalar_t>();
    for_each_row(rows, n, [&](std::int64_t r) {
      const scalar_t *yr = ys + r * n, *dyr = dys + r * n;
      scalar_t* dxr = dxs + r * n;
      const auto total = static_cast<scalar_t>(lane_sum(n, [&](std::int64_t i) { return double(dyr[i]); }));
      scaled_exp(dxr, yr, scalar_t(0), -total, n);  // -exp(y) * total
      for (std::int64_t i = 0; i < n; ++i) dxr[i] += dyr[i];
    });
  });
  return dx;
}

}  // namespace attograd::cpu
