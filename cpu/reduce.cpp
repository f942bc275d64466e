// Reductions on the CPU. sum walks the input once with the output broadcast
// over the reduced dims (stride 0), so any combination of dims and any input
// layout is one strided loop; max moves its dim last and scans rows.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/loops.h"
#include "cpu/vec_math.h"
#include "tensor/device_kernels.h"
#include "tensor/kernel_common.h"

namespace attograd::cpu {

namespace {

// part[c] = x[0, c] + x[1, c] + ... + x[rows - 1, c] for c < n, rows `cols`
// apart, in that order, in float32: for float32 and bfloat16 (widened
// exactly) compiled per SIMD level, the loops of sum_rows_of's group sum below
// 512 bits wide (at SSE2's width the bias gradients showed in a bfloat16 step).
AG_SIMD_CLONES void sum_group_f32(float* __restrict part, const float* x, std::int64_t rows, std::int64_t cols,
                                  std::int64_t n) {
  for (std::int64_t c = 0; c < n; ++c) part[c] = x[c];
  for (std::int64_t r = 1; r < rows; ++r)
    for (std::int64_t c = 0; c < n; ++c) part[c] += x[r * cols + c];
}
AG_SIMD_CLONES void sum_group_bf16(float* __restrict part, const std::uint16_t* x, std::int64_t rows,
                                   std::int64_t cols, std::int64_t n) {
  for (std::int64_t c = 0; c < n; ++c) part[c] = bfloat16_to_float(x[c]);
  for (std::int64_t r = 1; r < rows; ++r)
    for (std::int64_t c = 0; c < n; ++c) part[c] += bfloat16_to_float(x[r * cols + c]);
}
AG_SIMD_CLONES void add_group_f32(double* __restrict acc, const float* part, std::int64_t n) {
  for (std::int64_t c = 0; c < n; ++c) acc[c] += part[c];
}

// Sums of a contiguous (rows, cols) matrix along one axis, in float64, split
// over threads without sharing an accumulator: the two shapes that training
// produces all the time (bias gradients sum over rows; row statistics sum
// over cols). Every element's sum is accumulated in the same order whatever
// the thread count, so results do not depend on it.
//
// Each group of kGroup rows is first summed in T, with T-wide vector adds,
// then added into the float64 total: converting every element to double
// halved the vector width and made this several times slower than memory allows.
// bfloat16 rows are read as they are and summed in float32 (then float64), as
// their widened copy would be: the same bits, without writing that copy (the
// bias gradients of a bfloat16 step).
template <typename T>
void sum_rows_of(const T* x, std::int64_t rows, std::int64_t cols, T* out) {  // out[c] = sum_r x[r, c]
  using Part = std::conditional_t<std::is_same_v<T, bfloat16>, float, T>;
  constexpr std::int64_t kGroup = 8;
  parallel_for(0, cols, std::max<std::int64_t>(16, kParallelGrain / std::max<std::int64_t>(rows, 1)),
               [&](std::int64_t lo, std::int64_t hi) {
                 const std::int64_t n = hi - lo;
                 std::vector<double> total(n, 0.0);
                 std::vector<Part> group(n);
                 double* __restrict acc = total.data();
                 Part* __restrict part = group.data();
                 for (std::int64_t r0 = 0; r0 < rows; r0 += kGroup) {
                   const std::int64_t r1 = std::min(rows, r0 + kGroup);
                   if constexpr (std::is_same_v<Part, float>) {
                     if constexpr (std::is_same_v<T, float>)
                       sum_group_f32(part, x + r0 * cols + lo, r1 - r0, cols, n);
                     else
                       sum_group_bf16(part, reinterpret_cast<const std::uint16_t*>(x + r0 * cols + lo), r1 - r0, cols, n);
                     add_group_f32(acc, part, n);
                   } else {
                     std::copy(x + r0 * cols + lo, x + r0 * cols + hi, part);
                     for (std::int64_t r = r0 + 1; r < r1; ++r) {
                       const T* __restrict row = x + r * cols + lo;
                       for (std::int64_t c = 0; c < n; ++c) part[c] += row[c];
                     }
                     for (std::int64_t c = 0; c < n; ++c) acc[c] += part[c];
                   }
                 }
                 for (std::int64_t c = 0; c < n; ++c) out[lo + c] = static_cast<T>(acc[c]);
               });
}

// Sum of n contiguous values in float64 with 8 independent partial sums, so
// the adds pipeline (and vectorise) without reassociating under -ffast-math.
template <typename T>
double sum_contiguous(const T* p, std::int64_t n) {
  double partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) partial[j] += p[i + j];
  double total = 0;
  for (; i < n; ++i) total += p[i];
  for (double v : partial) total += v;
  return total;
}

template <typename T>
void sum_cols_of(const T* x, std::int64_t rows, std::int64_t cols, T* out) {  // out[r] = sum_c x[r, c]
  parallel_for(0, rows, std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(cols, 1)),
               [&](std::int64_t lo, std::int64_t hi) {
                 for (std::int64_t r = lo; r < hi; ++r) out[r] = static_cast<T>(sum_contiguous(x + r * cols, cols));
               });
}

// When x is contiguous and the reduced dims are exactly a leading or a
// trailing run, returns true with the (rows, cols) split and which axis goes.
bool as_matrix_reduction(const Tensor& x, const std::vector<int>& dims, std::int64_t& rows, std::int64_t& cols,
                         bool& over_rows) {
  if (!x.is_contiguous() || dims.empty()) return false;
  std::vector<bool> reduced(x.dim(), false);
  for (int d : dims) reduced[d] = true;
  const int nd = static_cast<int>(x.dim());
  int lead = 0;
  while (lead < nd && reduced[lead]) ++lead;
  int trail = 0;
  while (trail < nd && reduced[nd - 1 - trail]) ++trail;
  const int count = static_cast<int>(dims.size());
  if (lead != count && trail != count) return false;
  over_rows = lead == count;
  const int split = over_rows ? count : nd - count;
  rows = numel_of(Shape(x.sizes().begin(), x.sizes().begin() + split));
  cols = numel_of(Shape(x.sizes().begin() + split, x.sizes().end()));
  if (over_rows && cols == 1) {  // a full reduction: one long row
    over_rows = false;
    cols = rows;
    rows = 1;
  }
  return true;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  Shape kept = x.sizes();
  for (int d : dims) kept[d] = 1;
  std::int64_t rows = 0, cols = 0;
  bool over_rows = false;
  if (as_matrix_reduction(x, dims, rows, cols, over_rows)) {
    Tensor out = empty(kept, x.options());
    AG_DISPATCH_FLOAT_OR_BF16(x.dtype(), "sum", [&] {
      if (over_rows)
        sum_rows_of(x.data<scalar_t>(), rows, cols, out.data<scalar_t>());
      else
        sum_cols_of(x.data<scalar_t>(), rows, cols, out.data<scalar_t>());
    });
    return keepdim ? out : squeeze_dims(out, kept, dims);
  }
  // Accumulate in float64: a float32 sum over a million elements would lose digits.
  Tensor acc = zeros(kept, {DType::f64, x.device()});
  Operands<2> ops;
  set_operand(ops, 0, acc, x.sizes());
  set_operand(ops, 1, x, x.sizes());
  AG_DISPATCH_FLOAT_OR_BF16(x.dtype(), "sum", [&] {
    strided_loop<2>(
        x.sizes(), ops,
        [](std::array<char*, 2> p, std::array<std::int64_t, 2> s, std::int64_t n) {
          if (s[0] == 0) {  // reducing along the inner dim
            double total = 0;
            if (s[1] == sizeof(scalar_t)) {
              const auto* v = reinterpret_cast<const scalar_t*>(p[1]);
              for (std::int64_t i = 0; i < n; ++i) total += v[i];
            } else {
              for (std::int64_t i = 0; i < n; ++i) total += *reinterpret_cast<const scalar_t*>(p[1] + i * s[1]);
            }
            *reinterpret_cast<double*>(p[0]) += total;
          } else {
            for (std::int64_t i = 0; i < n; ++i)
              *reinterpret_cast<double*>(p[0] + i * s[0]) += *reinterpret_cast<const scalar_t*>(p[1] + i * s[1]);
          }
        },
        /*parallel_ok=*/false);
  });
  Tensor out = empty(kept, x.options());
  copy_(out, acc);
  return keepdim ? out : squeeze_dims(out, kept, dims);
}

kernels::MaxResult max(const Tensor& x, int dim, bool keepdim) {
  // Move `dim` last and make rows contiguous.
  const int nd = static_cast<int>(x.dim());
  Shape sizes, strides;
  for (int d = 0; d < nd; ++d)
    if (d != dim) sizes.push_back(x.sizes()[d]), strides.push_back(x.strides()[d]);
  sizes.push_back(x.sizes()[dim]);
  strides.push_back(x.strides()[dim]);
  Tensor rows = make_view(x, sizes, strides, x.offset());
  Tensor packed = empty(sizes, x.options());
  copy_(packed, rows);

  const std::int64_t n = sizes.back(), m = numel_of(sizes) / std::max<std::int64_t>(n, 1);
  Shape out_shape = x.sizes();
  out_shape[dim] = 1;
  Tensor values = empty(out_shape, x.options());
  Tensor indices = empty(out_shape, {DType::i64, x.device()});
  auto* idx = indices.data<std::int64_t>();
  AG_DISPATCH_FLOAT(x.dtype(), "max", [&] {
    const auto* v = packed.data<scalar_t>();
    auto* out = values.data<scalar_t>();
    for (std::int64_t r = 0; r < m; ++r) {
      const scalar_t* row = v + r * n;
      std::int64_t best = 0;
      for (std::int64_t i = 1; i < n; ++i)
        if (row[i] > row[best] || (row[i] != row[i] && row[best] == row[best])) best = i;  // NaN wins, like torch
      out[r] = row[best];
      idx[r] = best;
    }
  });
  if (!keepdim) {
    Shape squeezed = x.sizes();
    squeezed.erase(squeezed.begin() + dim);
    values = make_view(values, squeezed, contiguous_strides(squeezed), 0);
    indices = make_view(indices, squeezed, contiguous_strides(squeezed), 0);
  }
  return {values, indices};
}

}  // namespace attograd::cpu
