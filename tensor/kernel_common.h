#pragma once
// What the CPU (cpu/) and CUDA (cuda/bridge/) implementations of the
// device kernels share: how they see their tensors (the rows of a row op, a
// matrix operand's layout, a reduction's result) and the outputs they make.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensor/kernels.h"
#include "tensor/tensor.h"

namespace attograd {

// (rows, n) of a tensor whose last dim is n; no rows when it holds no elements.
struct RowShape {
  std::int64_t rows, n;
};
// Callers copy the fields into locals, not a structured binding: clang 14 (Debian 12's,
// used by the sanitizer and fuzzing build) cannot capture those in lambdas.
inline RowShape row_shape(const Tensor& x) {
  const std::int64_t n = x.size(-1);
  return {n == 0 ? 0 : x.numel() / n, n};
}

// One operand of a matrix product as a GEMM reads it: element (r, c) of its
// last two dims is at data[r * ld + c], or data[c * ld + r] when `transposed`
// (a transposed view goes to the GEMM as a flag, not a copy).
struct MatrixOperand {
  Tensor t;          // x itself, or a contiguous copy when its last two dims are neither layout
  bool transposed;   // column-major in its last two dims
  std::int64_t ld;   // leading dimension
};
inline MatrixOperand matrix_operand(const Tensor& x) {
  const std::int64_t rows = x.size(-2), cols = x.size(-1), rs = x.stride(-2), cs = x.stride(-1);
  // A size-1 dim's stride is arbitrary; the GEMM only needs ld >= the other extent.
  if ((cs == 1 || cols == 1) && (rows == 1 || rs >= std::max<std::int64_t>(cols, 1)))
    return {x, false, std::max<std::int64_t>({rows == 1 ? cols : rs, cols, 1})};
  if ((rs == 1 || rows == 1) && (cols == 1 || cs >= std::max<std::int64_t>(rows, 1)))
    return {x, true, std::max<std::int64_t>({cols == 1 ? rows : cs, rows, 1})};
  return {kernels::clone(x), false, std::max<std::int64_t>(cols, 1)};
}

// The batches of a batched matmul: a's and b's element strides over the
// broadcast batch shape (0 on a broadcast dim), and where batch i of each starts.
struct MatmulBatches {
  Shape shape, a_strides, b_strides;
  MatmulBatches(const Tensor& a, const Tensor& b, const Shape& batch_shape)
      : shape(batch_shape), a_strides(strides_of(a, batch_shape)), b_strides(strides_of(b, batch_shape)) {}
  std::int64_t count() const { return numel_of(shape); }
  void offsets(std::int64_t i, std::int64_t& a_offset, std::int64_t& b_offset) const {
    a_offset = b_offset = 0;
    for (std::size_t d = shape.size(); d-- > 0;) {
      const std::int64_t index = i % shape[d];
      i /= shape[d];
      a_offset += index * a_strides[d];
      b_offset += index * b_strides[d];
    }
  }

 private:
  static Shape strides_of(const Tensor& t, const Shape& batch_shape) {
    const Shape sizes(t.sizes().begin(), t.sizes().end() - 2), strides(t.strides().begin(), t.strides().end() - 2);
    return broadcast_strides(sizes, strides, batch_shape);
  }
};

// C (batch_shape..., M, N) of a (..., M, K) @ b (..., K, N), contiguous.
inline Tensor matmul_output(const Tensor& a, const Tensor& b, const Shape& batch_shape, DType dtype) {
  Shape out_shape = batch_shape;
  out_shape.push_back(a.size(-2));
  out_shape.push_back(b.size(-1));
  return empty(out_shape, {dtype, a.device()});
}
inline Tensor matmul_output(const Tensor& a, const Tensor& b, const Shape& batch_shape) {
  return matmul_output(a, b, batch_shape, a.dtype());
}

// A reduction's result `kept_result` (x's shape `kept` with the reduced dims
// of size 1, contiguous) seen without those dims (keepdim = false).
inline Tensor squeeze_dims(const Tensor& kept_result, const Shape& kept, const std::vector<int>& dims) {
  Shape squeezed;
  for (std::size_t d = 0; d < kept.size(); ++d)
    if (std::find(dims.begin(), dims.end(), static_cast<int>(d)) == dims.end()) squeezed.push_back(kept[d]);
  return make_view(kept_result, squeezed, contiguous_strides(squeezed), 0);
}

// layer_norm's outputs for input x: y shaped as x in y_dtype, mean and rstd one per row in x's dtype.
inline kernels::LayerNormResult layer_norm_outputs(const Tensor& x, DType y_dtype) {
  const Shape row_sizes(x.sizes().begin(), x.sizes().end() - 1);
  return {empty(x.sizes(), {y_dtype, x.device()}), empty(row_sizes, x.options()), empty(row_sizes, x.options())};
}

}  // namespace attograd
