// Reductions on CUDA tensors: the input's dims split into kept and reduced
// ones (cuda/bridge/launch.h), the kernels of cuda/reduce.cu pick how to walk
// them. Results have the CPU's shapes: the reduced dims kept as 1 or dropped.
#include <algorithm>

#include "cuda/bridge/launch.h"
#include "tensor/device_kernels.h"
#include "tensor/kernel_common.h"

namespace attograd::gpu {
namespace {

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  Shape kept = x.sizes();
  for (int d : dims) kept[d] = 1;
  Tensor out = empty(kept, x.options());
  const cuda::ReduceLayout layout = reduce_layout_of("sum", x, dims);
  AG_DISPATCH_FLOAT_OR_BF16(x.dtype(), "sum", [&] {
    cuda::sum<scalar_t>(out.data<scalar_t>(), x.data<scalar_t>(), layout, stream_of(x));
  });
  return keepdim ? out : squeeze_dims(out, kept, dims);
}

kernels::MaxResult max(const Tensor& x, int dim, bool keepdim) {
  Shape kept = x.sizes();
  kept[dim] = 1;
  Tensor values = empty(kept, x.options());
  Tensor indices = empty(kept, {DType::i64, x.device()});
  const cuda::ReduceLayout layout = reduce_layout_of("max", x, {dim});
  AG_DISPATCH_FLOAT(x.dtype(), "max", [&] {
    cuda::max<scalar_t>(values.data<scalar_t>(), indices.data<std::int64_t>(), x.data<scalar_t>(), layout,
                        stream_of(x));
  });
  if (keepdim) return {values, indices};
  return {squeeze_dims(values, kept, {dim}), squeeze_dims(indices, kept, {dim})};
}

}  // namespace attograd::gpu
