// Gathers on the CPU: embedding rows picked by id, and their scatter-add
// backward. Ids arrive range-checked, and every operand contiguous, from
// tensor/dispatch_rows.cpp (which also holds cat: copies, the same on both devices).
#include <cstring>

#include "tensor/device_kernels.h"
#include "cpu/parallel.h"

namespace attograd::cpu {

Tensor embedding_forward(const Tensor& weight, const Tensor& ids) {
  const std::int64_t channels = weight.size(1), count = ids.numel();
  Shape out_shape = ids.sizes();
  out_shape.push_back(channels);
  Tensor out = empty(out_shape, weight.options());  // ids.shape + (C)
  const std::size_t row_bytes = channels * dtype_size(weight.dtype());
  const auto* table = static_cast<const char*>(weight.raw_data());
  auto* dst = static_cast<char*>(out.raw_data());
  const std::int64_t* id = ids.data<std::int64_t>();
  parallel_for(0, count, std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(channels, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t i = begin; i < end; ++i)
                   std::memcpy(dst + i * row_bytes, table + id[i] * row_bytes, row_bytes);
               });
  return out;
}

Tensor embedding_backward(const Tensor& dy, const Tensor& ids, std::int64_t num_rows) {
  // forward: out[i] = weight[ids[i]]; so dweight[v] = sum of dy[i] over every i with ids[i] == v
  const std::int64_t channels = dy.size(-1), count = ids.numel();
  Tensor dweight = zeros({num_rows, channels}, dy.options());  // (V, C)
  const std::int64_t* id = ids.data<std::int64_t>();
  AG_DISPATCH_FLOAT(dy.dtype(), "embedding backward", [&] {
    const scalar_t* g = dy.data<scalar_t>();
    scalar_t* dw = dweight.data<scalar_t>();
    // Repeated ids add into the same row, so threads split the channels, not
    // the ids: no two threads touch one element, and each element sums its
    // contributions in id order, whatever the thread count.
    const std::int64_t grain = std::max<std::int64_t>(16, kParallelGrain / std::max<std::int64_t>(count, 1));
    parallel_for(0, channels, grain, [&](std::int64_t c_begin, std::int64_t c_end) {
      for (std::int64_t i = 0; i < count; ++i) {
        scalar_t* row = dw + id[i] * channels;
        const scalar_t* src = g + i * channels;
        for (std::int64_t c = c_begin; c < c_end; ++c) row[c] += src[c];
      }
    });
  });
  return dweight;
}

}  // namespace attograd::cpu
