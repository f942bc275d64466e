#pragma once
// Helpers for the kernels that work a row at a time over the last dim
// (softmax.cpp, cross_entropy.cpp, layer_norm.cpp): inputs are contiguous,
// read as (rows, n).
//
// Sums within a row use kLanes partial accumulators. Without -ffast-math the
// compiler must keep one running sum in program order and so cannot
// vectorise it; kLanes sums kept apart are independent, it vectorises them,
// and the fixed grouping keeps every result identical on 1 or 16 threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/vec_math.h"
#include "cpu/parallel.h"
#include "tensor/kernel_common.h"
#include "tensor/tensor.h"

namespace attograd::cpu {

// Sum of term(i) over [0, n), accumulated in float64 in kLanes lanes (each
// lane count groups the sum its own way, so a kernel keeps the one it has).
template <std::int64_t kLanes = 8, typename Term>
AG_ALWAYS_INLINE double lane_sum(std::int64_t n, Term term) {
  double acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::int64_t l = 0; l < kLanes; ++l) acc[l] += term(i + l);
  for (std::int64_t l = 0; i < n; ++i, ++l) acc[l] += term(i);
  double total = 0;
  for (double a : acc) total += a;
  return total;
}

// Rows per thread chunk: enough that a chunk is worth a thread.
inline std::int64_t row_grain(std::int64_t n) {
  return std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(n, 1));
}


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
// exp, compiled once per SIMD level (softmax.cpp); float64 through libm.
void scaled_exp_f32(float* y, const float* x, float shift, float scale, std::int64_t n);
inline void scaled_exp(float* y, const float* x, float shift, float scale, std::int64_t n) {
  scaled_exp_f32(y, x, shift, scale, n);
}
inline void scaled_exp(double* y, const double* x, double shift, double scale, std::int64_t n) {
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

}  // namespace attograd::cpu
