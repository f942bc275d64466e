// Cross-entropy on the CPU over the last dim of the logits: the loss of each
// row's target and its gradient, from the row's log-sum-exp (rows.h). Inputs
// arrive contiguous (tensor/dispatch_rows.cpp) and are read as (rows, n).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "cpu/bf16_rounding.h"
#include "cpu/rows.h"
#include "cpu/vec_math.h"
#include "tensor/device_kernels.h"
#include "tensor/kernel_common.h"
#include "cpu/parallel.h"

namespace attograd::cpu {

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

// Element by element, each read before it is written: dx may be the logits.
void cross_entropy_backward(const Tensor& dx, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            std::int64_t ignore_index, std::int64_t count, double dloss) {
  // forward: loss = sum over counted rows of (lse - x[target]) / count;
  // so dx = (softmax(x) - onehot(target)) * dloss / count, with softmax(x) = exp(x - lse)
  const std::int64_t rows = logits.size(0), n = logits.size(1);
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
}

}  // namespace attograd::cpu
