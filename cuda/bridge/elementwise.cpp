// Elementwise ops on CUDA tensors: each builds the strided layout of its loop
// (cuda/bridge/launch.h) and calls its launcher in cuda/elementwise.cu.
#include "cuda/bridge/launch.h"
#include "tensor/device_kernels.h"

namespace attograd::gpu {
Tensor unary(kernels::Unary op, const Tensor& x, double s) {
  const char* name = kernels::unary_name(op);
  Tensor out = empty(x.sizes(), x.options());
  const auto layout = layout_of<2>(name, out.sizes(), {&out, &x});
  AG_DISPATCH_FLOAT_OR_BF16(x.dtype(), name, [&] {
    cuda::unary<scalar_t>(op, out.data<scalar_t>(), x.data<scalar_t>(),
                          static_cast<compute_t<scalar_t>>(s), layout, stream_of(x));
  });
  return out;
}

Tensor binary(kernels::Binary op, const Tensor& a, const Tensor& b, const Shape& out_shape, DType out_dtype) {
  const char* name = kernels::binary_name(op);
  Tensor out = empty(out_shape, {out_dtype, a.device()});
  const auto layout = layout_of<3>(name, out_shape, {&out, &a, &b});
  if (a.dtype() != b.dtype()) {  // float32 with bfloat16 (kernels::binary checked it): a float32 result
    if (a.dtype() == DType::f32)
      cuda::binary_widening(op, out.data<float>(), a.data<float>(), b.data<bfloat16>(), layout, stream_of(a));
    else
      cuda::binary_widening(op, out.data<float>(), a.data<bfloat16>(), b.data<float>(), layout, stream_of(a));
    return out;
  }
  AG_DISPATCH_FLOAT_OR_BF16(a.dtype(), name, [&] {
    if (is_comparison(op))
      cuda::compare<scalar_t>(op, out.data<bool>(), a.data<scalar_t>(), b.data<scalar_t>(), layout, stream_of(a));
    else
      cuda::binary<scalar_t>(op, out.data<scalar_t>(), a.data<scalar_t>(), b.data<scalar_t>(), layout, stream_of(a));
  });
  return out;
}

Tensor where(const Tensor& mask, const Tensor& a, const Tensor& b, const Shape& out_shape) {
  Tensor out = empty(out_shape, a.options());
  const auto layout = layout_of<4>("where", out_shape, {&out, &mask, &a, &b});
  visit_dtype(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cuda::where<T>(out.data<T>(), mask.data<bool>(), a.data<T>(), b.data<T>(), layout, stream_of(a));
  });
  return out;
}

void copy_(const Tensor& dst, const Tensor& src) {
  const auto layout = layout_of<2>("copy_", dst.sizes(), {&dst, &src});
  visit_dtype(dst.dtype(), [&](auto out_zero) {
    visit_dtype(src.dtype(), [&](auto in_zero) {
      using Out = decltype(out_zero);
      using In = decltype(in_zero);
      cuda::copy<Out, In>(dst.data<Out>(), src.data<In>(), layout, stream_of(dst));
    });
  });
}

void fill_(const Tensor& dst, double value) {
  const auto layout = layout_of<1>("fill_", dst.sizes(), {&dst});
  visit_dtype(dst.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cuda::fill<T>(dst.data<T>(), static_cast<T>(value), layout, stream_of(dst));
  });
}

void add_(const Tensor& y, const Tensor& x, double alpha) {
  const auto layout = layout_of<2>("add_", y.sizes(), {&y, &x});
  AG_DISPATCH_FLOAT_OR_BF16(y.dtype(), "add_", [&] {
    cuda::add_scaled<scalar_t>(y.data<scalar_t>(), x.data<scalar_t>(),
                               static_cast<compute_t<scalar_t>>(alpha), layout, stream_of(y));
  });
}

}  // namespace attograd::gpu
