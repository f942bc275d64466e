// LayerNorm on CUDA tensors, over the last dim: the launchers of
// cuda/layer_norm.cu. Inputs arrive contiguous (tensor/dispatch_rows.cpp) and
// are read as (rows, n), as on the CPU.
#include <type_traits>

#include "cuda/bridge/launch.h"
#include "tensor/device_kernels.h"
#include "tensor/kernel_common.h"

namespace attograd::gpu {
namespace {

template <typename T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

// y in x's dtype, or bfloat16 from a float32 x (y_dtype), rounded in the kernel.
kernels::LayerNormResult layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                                            DType y_dtype) {
  const kernels::LayerNormResult out = layer_norm_outputs(x, y_dtype);
  const RowShape shape = row_shape(x);
  AG_DISPATCH_FLOAT(x.dtype(), "layer_norm", [&] {
    const auto launch = [&](auto* y) {
      cuda::layer_norm_forward(y, out.mean.data<scalar_t>(), out.rstd.data<scalar_t>(), x.data<scalar_t>(),
                               data_or_null<scalar_t>(weight), data_or_null<scalar_t>(bias), shape.rows, shape.n, eps,
                               stream_of(x));
    };
    if constexpr (std::is_same_v<scalar_t, float>)
      if (y_dtype == DType::bf16) return launch(out.y.data<bfloat16>());
    launch(out.y.data<scalar_t>());
  });
  return out;
}

// dy in x's dtype, or bfloat16 with a float32 x (the gradient of a bfloat16 y), widened in the kernel.
kernels::LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                            const Tensor& mean, const Tensor& rstd) {
  const RowShape shape = row_shape(x);
  kernels::LayerNormGrads grads{empty(x.sizes(), x.options()), Tensor(), empty({shape.n}, x.options())};
  if (weight.defined()) grads.dweight = empty({shape.n}, x.options());
  AG_DISPATCH_FLOAT(x.dtype(), "layer_norm backward", [&] {
    const auto launch = [&](const auto* g) {
      cuda::layer_norm_backward(grads.dx.data<scalar_t>(),
                                grads.dweight.defined() ? grads.dweight.data<scalar_t>() : nullptr,
                                grads.dbias.data<scalar_t>(), g, x.data<scalar_t>(), data_or_null<scalar_t>(weight),
                                mean.data<scalar_t>(), rstd.data<scalar_t>(), shape.rows, shape.n, stream_of(x));
    };
    if constexpr (std::is_same_v<scalar_t, float>)
      if (dy.dtype() == DType::bf16) return launch(dy.data<bfloat16>());
    launch(dy.data<scalar_t>());
  });
  return grads;
}

}  // namespace attograd::gpu
