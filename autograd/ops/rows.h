#pragma once
// Views the product ops share (matmul.cpp, loss.cpp): operands as the (N, in)
// rows of one GEMM, and transposes read by the kernels through their strides.
#include <cstdint>

#include "tensor/kernels.h"
#include "tensor/tensor.h"

namespace attograd::rows {

// The last two dims swapped, as a view.
inline Tensor mT(const Tensor& x) {
  Shape sizes = x.sizes(), strides = x.strides();
  std::swap(sizes.end()[-1], sizes.end()[-2]);
  std::swap(strides.end()[-1], strides.end()[-2]);
  return make_view(x, sizes, strides, x.offset());
}

// x (..., in) as one (N, in) matrix, contiguous: the rows of linear's GEMM.
// N from the leading dims, not numel / in: with in = 0 that made N = 0, and
// the (..., out) result a view of an empty product, read past its storage.
inline Tensor as_rows(const Tensor& x, std::int64_t in) {
  std::int64_t rows = 1;
  for (int d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  const Tensor c = kernels::contiguous(x);
  return make_view(c, {rows, in}, {in, 1}, c.offset());
}

// Rows [first, first + count) of a contiguous (N, in) matrix, as a view.
inline Tensor row_range(const Tensor& m, std::int64_t first, std::int64_t count) {
  return make_view(m, {count, m.size(1)}, {m.size(1), 1}, m.offset() + first * m.size(1));
}

}  // namespace attograd::rows
