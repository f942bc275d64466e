// Gathers on CUDA tensors: embedding rows picked by id, and their scatter-add
// backward. Ids arrive range-checked, and every operand contiguous, from
// tensor/dispatch_rows.cpp (which also holds cat: copies, the same on both devices).
#include "cuda/bridge/launch.h"
#include "tensor/device_kernels.h"

namespace attograd::gpu {

Tensor embedding_forward(const Tensor& weight, const Tensor& ids) {
  const std::int64_t channels = weight.size(1);
  Shape out_shape = ids.sizes();
  out_shape.push_back(channels);
  Tensor out = empty(out_shape, weight.options());  // ids.shape + (C)
  AG_DISPATCH_FLOAT(weight.dtype(), "embedding", [&] {
    cuda::embedding_forward(out.data<scalar_t>(), weight.data<scalar_t>(), ids.data<std::int64_t>(), ids.numel(),
                            channels, stream_of(weight));
  });
  return out;
}

Tensor embedding_backward(const Tensor& dy, const Tensor& ids, std::int64_t num_rows) {
  const std::int64_t channels = dy.size(-1);
  Tensor dweight = empty({num_rows, channels}, dy.options());  // (V, C), every element written by the launcher
  AG_DISPATCH_FLOAT(dy.dtype(), "embedding backward", [&] {
    cuda::embedding_backward(dweight.data<scalar_t>(), dy.data<scalar_t>(), ids.data<std::int64_t>(), ids.numel(),
                             channels, num_rows, stream_of(dy));
  });
  return dweight;
}

}  // namespace attograd::gpu
