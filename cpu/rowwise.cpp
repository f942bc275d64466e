// Row ops on the CPU: softmax, log_softmax and cross-entropy, all over the
// last dim (LayerNorm is in layer_norm.cpp). Inputs arrive contiguous
// (tensor/dispatch_rows.cpp) and are read as (rows, n); rows are independent, so
// they are split across threads when the work is large enough. Sums within a
// row go through lane_sum (rows.h); float32 exponentials use the vectorised
// exp of cpu/vec_math.h.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/bf16_rounding.h"
#include "cpu/rows.h"
#include "cpu/vec_math.h"
#include "tensor/device_kernels.h"
#include "tensor/kernel_common.h"
#include "cpu/parallel.h"

namespace attograd::cpu {
namespace {

// max over a row; NaNs are skipped here, but they still poison the row's
// exponentials downstream, so a NaN input gives a NaN row.
template <typename T>
T row_max(const T* x, std::int64_t n) {
  constexpr std::int64_t kLanes = 8;
  T acc[kLanes];
  for (auto& a : acc) a = -std::numeric_limits<T>::infinity();
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::int64_t l = 0; l < kLanes; ++l) acc[l] = x[i + l] > acc[l] ? x[i + l] : acc[l];
  for (std::int64_t l = 0; i < n; ++i, ++l) acc[l] = x[i] > acc[l] ? x[i] : acc[l];
  T m = acc[0];
  for (auto a : acc) m = a > m ? a : m;
  return m;
}

// y[i] = exp(x[i] - shift) * scale over a row: float32 through the polynomial
// exp, compiled once per SIMD level; float64 through libm.
AG_SIMD_CLONES void scaled_exp_f32(float* y, const float* x, float shift, float scale, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = exp_fast(x[i] - shift) * scale;
}
void scaled_exp(float* y, const float* x, float shift, float scale, std::int64_t n) {
  scaled_exp_f32(y, x, shift, scale, n);
}
void scaled_exp(double* y, const double* x, double shift, double scale, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i] - shift) * scale;
}

// log(sum(exp(x))) of a row, shifted by its max so no exponential overflows;
// `scratch` (n) receives the shifted exponentials.
template <typename T>
double row_logsumexp(const T* x, T* scratch, std::int64_t n) {
  const T m = row_max(x, n);
  scaled_exp(scratch, x, m, T(1), n);
  const double s = lane_sum(n, [&](std::int64_t i) { return static_cast<double>(scratch[i]); });
  return static_cast<double>(m) + std::log(s);
}

// Calls fn(row) for every row in [0, rows), split across threads when rows * n is large.
template <typename Fn>
void for_each_row(std::int64_t rows, std::int64_t n, Fn fn) {
  parallel_for(0, rows, row_grain(n), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) fn(r);
  });
}

}  // namespace

// ---- softmax ---------------------------------------------------------------------

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

// ---- cross-entropy ---------------------------------------------------------------
// bfloat16 logits (under autocast) are widened a row at a time into a buffer,
// and their gradient computed there and rounded once into its row: the
// float32 kernel's bits on the widened logits, with lse and the loss float32,
// without a float32 copy of the logits or of their gradient (at GPT-2's
// vocabulary, 50257 values a row, each is as large as the model's activations).

namespace {

// A row of L values as T ones: the row itself, or bfloat16's widened into `wide`.
template <typename T, typename L>
const T* row_as(const L* row, std::vector<T>& wide, std::int64_t n) {
  if constexpr (std::is_same_v<T, L>) {
    return row;
  } else {
    wide.resize(static_cast<std::size_t>(n));
    widen_bf16(wide.data(), reinterpret_cast<const std::uint16_t*>(row), n);
    return wide.data();
  }
}

// A counted row's gradient, exp(x - lse) s minus s at the target, in L (bfloat16:
// computed in T over the widened row, then rounded once).
template <typename T, typename L>
void cross_entropy_grad_row(L* dxr, const L* xr, T lse, T s, std::int64_t target, std::int64_t n) {
  if constexpr (std::is_same_v<T, L>) {
    scaled_exp(dxr, xr, lse, s, n);
    dxr[target] -= s;
  } else {
    thread_local std::vector<T> wide, wide_dx;
    wide_dx.resize(static_cast<std::size_t>(n));
    scaled_exp(wide_dx.data(), row_as(xr, wide, n), lse, s, n);
    wide_dx[target] -= s;
    round_to_bf16(reinterpret_cast<std::uint16_t*>(dxr), wide_dx.data(), n);
  }
}

}  // namespace

kernels::CrossEntropyResult cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                                  std::int64_t ignore_index) {
  const std::int64_t rows = logits.size(0), n = logits.size(1);
  const TensorOptions stats{compute_dtype(logits.dtype()), logits.device()};
  kernels::CrossEntropyResult out{empty({}, stats), empty({rows}, stats), 0};
  const std::int64_t* t = targets.data<std::int64_t>();
  std::vector<double> row_loss(rows, 0.0);  // (N): lse - logit[target], 0 on ignored rows
  AG_DISPATCH_FLOAT_OR_BF16(logits.dtype(), "cross_entropy", [&] {
    using T = compute_t<scalar_t>;
    const scalar_t* xs = logits.data<scalar_t>();
    T* lses = out.lse.data<T>();
    parallel_for(0, rows, row_grain(n), [&](std::int64_t begin, std::int64_t end) {
      std::vector<T> scratch(n), wide;
      for (std::int64_t r = begin; r < end; ++r) {
        const T* xr = row_as(xs + r * n, wide, n);
        const double lse = row_logsumexp(xr, scratch.data(), n);
        lses[r] = static_cast<T>(lse);
        if (t[r] != ignore_index) row_loss[r] = lse - static_cast<double>(xr[t[r]]);
      }
    });
    // Added in row order (not per thread) so the loss is reproducible.
    double total = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      total += row_loss[r];
      out.count += t[r] != ignore_index;
    }
    // No counted rows: a loss of 0 rather than 0/0, so a batch of padding trains nothing.
    out.loss.data<T>()[0] = static_cast<T>(out.count > 0 ? total / out.count : 0.0);
  });
  return out;
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              std::int64_t ignore_index, std::int64_t count, double dloss) {
  // forward: loss = sum over counted rows of (lse - x[target]) / count;
  // so dx = (softmax(x) - onehot(target)) * dloss / count, with softmax(x) = exp(x - lse)
  const std::int64_t rows = logits.size(0), n = logits.size(1);
  Tensor dx = empty(logits.sizes(), logits.options());
  const std::int64_t* t = targets.data<std::int64_t>();
  const double scale = count > 0 ? dloss / static_cast<double>(count) : 0.0;
  AG_DISPATCH_FLOAT_OR_BF16(logits.dtype(), "cross_entropy backward", [&] {
    using T = compute_t<scalar_t>;
    const scalar_t* xs = logits.data<scalar_t>();
    const T* lses = lse.data<T>();
    scalar_t* dxs = dx.data<scalar_t>();
    const auto s = static_cast<T>(scale);
    for_each_row(rows, n, [&](std::int64_t r) {
      scalar_t* dxr = dxs + r * n;
      if (t[r] == ignore_index || count == 0)
        std::fill(dxr, dxr + n, scalar_t(T(0)));
      else
        cross_entropy_grad_row(dxr, xs + r * n, lses[r], s, t[r], n);
    });
  });
  return dx;
}

}  // namespace attograd::cpu
