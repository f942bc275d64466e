// Batched matmul on CUDA tensors (float32), with an optional bias added to
// every row: each operand goes to the SGEMM of
// cuda/matmul.cu as it lies in memory when its last two dims are row-major or
// column-major (a transposed view), exactly as the CPU hands operands to BLAS;
// anything else is copied to contiguous first.
#include "tensor/device_kernels.h"
#include "tensor/cuda/launch.h"

namespace attograd::gpu {
namespace {

struct Operand {
  Tensor t;  // a view the kernel can read
  cuda::GemmOperand gemm;
};

Operand as_gemm_operand(const Tensor& x) {
  const std::int64_t rows = x.size(-2), cols = x.size(-1), rs = x.stride(-2), cs = x.stride(-1);
  // A size-1 dim's stride is arbitrary; the kernel only needs ld >= the other extent.
  if ((cs == 1 || cols == 1) && (rows == 1 || rs >= std::max<std::int64_t>(cols, 1)))
    return {x, {x.data<float>(), std::max<std::int64_t>({rows == 1 ? cols : rs, cols, 1}), false}};
  if ((rs == 1 || rows == 1) && (cols == 1 || cs >= std::max<std::int64_t>(rows, 1)))
    return {x, {x.data<float>(), std::max<std::int64_t>({cols == 1 ? rows : cs, rows, 1}), true}};
  Tensor packed = empty(x.sizes(), x.options());
  copy_(packed, x);
  return {packed, {packed.data<float>(), std::max<std::int64_t>(cols, 1), false}};
}

// Element strides of t's batch dims over the broadcast batch shape (0 where broadcast).
Shape batch_strides(const Tensor& t, const Shape& batch_shape) {
  const Shape sizes(t.sizes().begin(), t.sizes().end() - 2), strides(t.strides().begin(), t.strides().end() - 2);
  return broadcast_strides(sizes, strides, batch_shape);
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in, const Shape& batch_shape, const Tensor& bias) {
  const std::int64_t m = a_in.size(-2), k = a_in.size(-1), n = b_in.size(-1);
  Shape out_shape = batch_shape;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out = empty(out_shape, a_in.options());
  if (out.numel() == 0) return out;
  const Operand a = as_gemm_operand(a_in), b = as_gemm_operand(b_in);
  const auto batch = collapse<2>("matmul", batch_shape, {batch_strides(a.t, batch_shape), batch_strides(b.t, batch_shape)});
  cuda::sgemm(out.data<float>(), a.gemm, b.gemm, m, n, k, batch, stream_of(out));
  // The bias in a second pass over C (the CPU writes it into C before the product).
  if (bias.defined()) add_(out, bias, 1.0);
  return out;
}

}  // namespace attograd::gpu
