// Reductions on the CPU. sum walks the input once with the output broadcast
// over the reduced dims (stride 0), so any combination of dims and any input
// layout is one strided loop; max moves its dim last and scans rows.
#include <limits>

#include "tensor/cpu/cpu_kernels.h"
#include "tensor/cpu/loops.h"

namespace attograd::cpu {

Tensor sum(const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  Shape kept = x.sizes();
  for (int d : dims) kept[d] = 1;
  // Accumulate in float64: a float32 sum over a million elements would lose digits.
  Tensor acc = zeros(kept, {DType::f64, x.device()});
  Operands<2> ops;
  set_operand(ops, 0, acc, x.sizes());
  set_operand(ops, 1, x, x.sizes());
  AG_DISPATCH_FLOAT(x.dtype(), "sum", [&] {
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
  if (keepdim) return out;
  Shape squeezed;
  for (std::size_t d = 0; d < kept.size(); ++d)
    if (std::find(dims.begin(), dims.end(), static_cast<int>(d)) == dims.end()) squeezed.push_back(kept[d]);
  return make_view(out, squeezed, contiguous_strides(squeezed), 0);
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
