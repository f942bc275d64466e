#pragma once
// Helpers for the kernels that work a row at a time over the last dim
// (rowwise.cpp, layer_norm.cpp): inputs are contiguous, read as (rows, n).
//
// Sums within a row use kLanes partial accumulators. Without -ffast-math the
// compiler must keep one running sum in program order and so cannot
// vectorise it; kLanes sums kept apart are independent, it vectorises them,
// and the fixed grouping keeps every result identical on 1 or 16 threads.
#include <algorithm>
#include <cstdint>

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

}  // namespace attograd::cpu
